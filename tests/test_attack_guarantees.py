"""What the attack base class guarantees for every attack, plugins included (issue #17): its
own copy of the inputs, a checked result (shape, dtype, device, finite), a declared norm and
a result inside that budget."""

from __future__ import annotations

import pytest
import torch

from aisafety.attack.base import Attack
from aisafety.attack.fgsm import FGSM
from aisafety.attack.random_noise import RandomNoise
from aisafety.errors import PluginError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.torch_module import TorchPredictor


@pytest.fixture(scope="module")
def batch(mnist_subset):
    data = mnist_subset(20, seed=5)
    return data.x, data.y


def _plugin(name: str, body, norm=Norm.LINF):
    return type(
        name.title().replace("-", ""),
        (Attack,),
        {
            "name": name,
            "family": AttackFamily.GRADIENT,
            "norm": norm,
            "requires": Capability.LABELS,
            "perturb": lambda self, predictor, x, y, eps, call: body(x, eps),
        },
    )


def _steps(x):
    return torch.ones(len(x), dtype=torch.long)


def _write_into_input(x, eps):
    x.fill_(0.5)  # writes into the batch it was handed
    return x.clone(), _steps(x)


def test_an_attack_writing_into_its_input_changes_nothing_outside(zoo_predictor, batch):
    """The attack works on its own copy: the caller's batch, the result's clean inputs and
    the next attack's results are untouched, and no success comes from a moved 'clean' x."""
    x, y = batch
    original = x.clone()
    writer = _plugin("writes-input", _write_into_input)()
    result = writer(zoo_predictor, x, y, 0.1)
    assert torch.equal(x, original)
    assert torch.equal(result.x, original)
    # the candidate (0.5 everywhere) is projected into the budget around the real x
    assert float((result.x_adv - original).abs().max()) <= 0.1 + 1e-6
    after = FGSM()(zoo_predictor, x, y, 0.1).x_adv
    assert torch.equal(after, FGSM()(zoo_predictor, original, y, 0.1).x_adv)


@pytest.mark.parametrize(
    "body, message",
    [
        (lambda x, eps: (x[:1], _steps(x)), r"inputs of shape \(1, 1, 28, 28\) for a batch"),
        (lambda x, eps: (x[:, :, :27].clone(), _steps(x)), "one adversarial input per input"),
        (lambda x, eps: (x.double(), _steps(x)), "dtype torch.float64"),
        (lambda x, eps: (x.clone(), _steps(x)[:3]), "one step"),
        (lambda x, eps: (x.clone(), None), "must return two tensors"),
        (lambda x, eps: (x + float("nan"), _steps(x)), "NaN or inf for 20 of 20 samples"),
        (
            lambda x, eps: (x.clone().index_fill_(0, torch.tensor([3]), torch.inf), _steps(x)),
            "sample 3",
        ),
    ],
)
def test_a_malformed_result_is_an_error_naming_the_attack(zoo_predictor, batch, body, message):
    x, y = batch
    attack = _plugin("misbehaves", body)()
    with pytest.raises(PluginError, match="attack 'misbehaves' returned") as caught:
        attack(zoo_predictor, x, y, 0.1)
    assert caught.match(message)


def test_one_image_for_twenty_is_not_broadcast(zoo_predictor, batch):
    x, y = batch
    attack = _plugin("one-for-all", lambda x, eps: (x[:1].clone(), _steps(x)))()
    with pytest.raises(PluginError, match="one adversarial input per input"):
        attack(zoo_predictor, x, y, 0.1)


def test_an_over_budget_plugin_is_projected_into_its_budget(zoo_predictor, batch):
    x, y = batch
    attack = _plugin("too-far", lambda x, eps: (x + 10 * eps, _steps(x)), norm=Norm.L2)()
    result = attack(zoo_predictor, x, y, 1.0)
    assert float((result.x_adv - x).flatten(1).norm(dim=1).max()) <= 1.0 + 1e-5


@pytest.mark.parametrize("norm", [None, Norm.L0, "l3"])
def test_an_attack_without_a_usable_norm_is_refused_naming_it_and_the_fix(
    zoo_predictor, batch, norm
):
    """No norm (or one without a threat model: l0, a plain string) would let the attack's
    results escape the budget check: refused when the attack is built, before any work."""
    cls = _plugin("normless", lambda x, eps: (x + 10 * eps, _steps(x)), norm=norm)
    with pytest.raises(PluginError, match="attack 'normless'") as caught:
        cls()
    assert caught.match(r"declares norm .*; every attack must declare the norm of its budget")
    assert caught.match(r"norm = Norm\.LINF")


def test_an_attack_that_skips_the_base_init_is_refused_when_called(zoo_predictor, batch):
    x, y = batch
    cls = _plugin("no-init", lambda x, eps: (x + 10 * eps, _steps(x)), norm=None)
    cls.__init__ = lambda self: None
    with pytest.raises(PluginError, match="attack 'no-init'.*declares norm None"):
        cls()(zoo_predictor, x, y, 0.1)


class _FirstPixel(torch.nn.Module):
    """Class 1 where the first pixel is above 0.5, else class 0 (a margin of 100 per unit)."""

    def forward(self, x):
        gap = 100 * (x.flatten(1)[:, 0] - 0.5)
        return torch.stack([torch.zeros_like(gap), gap], 1)


def test_a_clean_mistake_is_never_returned_classified_correctly():
    """A sample the model gets wrong clean is its own adversarial example (distance 0): where
    an attack returns a point the model classifies correctly, the clean input stands, so robust
    accuracy never exceeds clean accuracy (AutoAttack attacks such samples not at all). Found
    by the attack fuzz (testkit/attack_fuzz.py): random-noise's last draw, PGD-l2/l1, APGD and
    FGSM came back robust on clean mistakes (robust accuracy 0.5 against clean 0.17)."""
    model = TorchPredictor(_FirstPixel(), (1, 1, 1), 2, name="first-pixel")
    x = torch.tensor([0.45, 0.45, 0.55, 0.3]).view(-1, 1, 1, 1)
    y = torch.tensor([1, 1, 1, 0])  # samples 0 and 1 wrong clean, 2 and 3 right
    towards_label = _plugin("towards-label", lambda x, eps: (x + eps, _steps(x)))()
    result = towards_label(model, x, y, 0.1)  # moves 0.45 to 0.55: class 1, the label
    assert result.success.tolist() == [True, True, False, False]
    assert torch.equal(result.x_adv[:2], x[:2])  # the clean mistakes, as they were
    assert torch.equal(result.adv_logits[:2], result.clean_logits[:2])
    assert result.robust_accuracy == 0.5 == float((result.clean_pred == y).double().mean())
    # a built-in attack: one +-0.1 draw per sample puts about half the clean mistakes at 0.55
    noise = RandomNoise({"draws": 1})(model, x[:1].repeat(16, 1, 1, 1), y[:1].repeat(16), 0.1)
    assert bool(noise.success.all()), f"{int((~noise.success).sum())} of 16 made correct"


def test_an_l1_result_is_inside_its_ball_in_float64_after_rounding():
    """x + delta in float32 rounds each changed pixel by up to half a unit in the last place,
    outwards as often as not; over 784 pixels that added 0.47% of the budget at l1 eps 0.001
    (the attack fuzz: pgd-l1 on 28x28 nets, 0.38% over). The base class's guarantee now
    holds in float64 (L1Threat.contain rounds each coordinate of a sample over budget
    towards the clean input), and a result already inside is returned bit for bit."""
    model = TorchPredictor(_FirstPixel(), (1, 28, 28), 2, name="first-pixel-28")
    x = torch.full((2, 1, 28, 28), 0.3)
    y = torch.tensor([0, 0])
    spread = _plugin("spread", lambda x, eps: (x + eps / 784, _steps(x)), norm=Norm.L1)()
    result = spread(model, x, y, 0.001)
    size = (result.x_adv.double() - x.double()).flatten(1).abs().sum(1)
    assert bool((size <= 0.001).all()), f"l1 size {size.tolist()} over 0.001"
    ulp = float(torch.nextafter(torch.tensor(0.3), torch.tensor(1.0)) - torch.tensor(0.3))
    assert float(size.min()) >= 0.001 - 784 * ulp  # shrunk by at most a unit per pixel
    inside = _plugin("inside", lambda x, eps: (x + eps / 2000, _steps(x)), norm=Norm.L1)()
    kept = inside(model, x, y, 0.001)
    assert torch.equal(kept.x_adv, x + 0.001 / 2000)
