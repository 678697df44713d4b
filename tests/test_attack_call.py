"""The stateless attack call (issue #11): per-call inputs in one ``AttackCall``, targeted
attacks, the base class's shared preamble, and one threat model per norm."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from aisafety.attack.base import Attack
from aisafety.attack.call import AttackCall
from aisafety.attack.threat import L1Threat, L2Threat, LinfThreat, threat_model
from aisafety.errors import InputError, PluginError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.plugins import default_registry

EPS = {Norm.LINF: 0.3, Norm.L2: 3.0, Norm.L1: 15.0}
FAST = {
    "pgd-linf": {"steps": 20},
    "pgd-l2": {"steps": 20},
    "pgd-l1": {"steps": 20},
    "bim": {"steps": 20},
    "mi-fgsm": {"steps": 20},
    "apgd-ce": {"steps": 20},
    "apgd-dlr": {"steps": 20},
    "apgd-mar": {"steps": 20},
    "apgd-ce-l2": {"steps": 20},
    "apgd-dlr-l2": {"steps": 20},
    "apgd-mar-l2": {"steps": 20},
    "apgd-t": {"steps": 20},
    "apgd-t-l2": {"steps": 20},
    "fab-t": {"steps": 20},
    "fab-t-l2": {"steps": 20},
    "transfer": {"attack_config": {"steps": 20}},
}


def _attacks() -> dict[str, type[Attack]]:
    registry = default_registry()
    return {name: registry.get("attack", name) for name in registry.names("attack")}


TARGETED = sorted(name for name, cls in _attacks().items() if cls.targeted)
UNTARGETED = sorted(
    name for name, cls in _attacks().items() if not cls.targeted and name != "transfer"
)


@pytest.fixture(scope="module")
def batch(mnist_subset):
    data = mnist_subset(20, seed=4)
    target = (data.y + 1 + torch.arange(len(data.y)) % 9) % 10  # never the true label
    return data.x, data.y, target


def test_the_gradient_attacks_declare_targets():
    assert {"fgsm", "bim", "pgd-linf", "pgd-l2", "pgd-l1", "mi-fgsm", "r-fgsm"} <= set(TARGETED)
    assert {"apgd-ce", "apgd-dlr", "apgd-mar", "apgd-ce-l2", "apgd-t", "fab-t"} <= set(TARGETED)
    assert {"square-linf", "cw-l2", "deepfool-l2", "boundary", "standard"} <= set(UNTARGETED)


@pytest.mark.parametrize("name", TARGETED)
def test_targeted_call_moves_towards_the_target(zoo_predictor, batch, name):
    """Towards the target, the target's logit gains on the true one far more than
    untargeted: the attack follows ``call.target``."""
    x, y, target = batch
    attack = default_registry().create("attack", name, FAST.get(name, {}))
    eps = EPS[attack.norm]
    aimed = attack(zoo_predictor, x, y, eps, target=target)
    free = attack(zoo_predictor, x, y, eps)

    def gain(result):
        logits = result.adv_logits
        return (logits.gather(1, target[:, None]) - logits.gather(1, y[:, None])).mean()

    assert torch.equal(aimed.target, target)
    assert float(gain(aimed)) > float(gain(free))
    # iterative attacks reach most targets (the targeted DLR loss only needs misclassification,
    # as in AutoAttack's APGD-T, so it is checked by the gain alone)
    if name not in ("fgsm", "r-fgsm") and "dlr" not in name and not name.startswith("apgd-t"):
        assert float(aimed.hit_target.double().mean()) >= 0.25
    assert torch.equal(aimed.success, aimed.adv_pred != y)  # success is misclassification


@pytest.mark.parametrize("name", UNTARGETED)
def test_an_untargeted_attack_refuses_targets_by_name(zoo_predictor, batch, name):
    x, y, target = batch
    attack = default_registry().create("attack", name)
    with pytest.raises(InputError, match=f"attack '{name}' is untargeted only"):
        attack(zoo_predictor, x, y, 0.1, target=target)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda y: y, "equals the sample's true label"),
        (lambda y: ((y + 1) % 10).float(), "integer class indices"),
        (lambda y: ((y + 1) % 10)[:3], "one class per sample"),
        (lambda y: torch.full_like(y, 10), "must lie in 0..9"),
    ],
)
def test_bad_targets_raise_input_error(zoo_predictor, batch, bad, message):
    x, y, _ = batch
    with pytest.raises(InputError, match=message):
        default_registry().create("attack", "pgd-linf")(zoo_predictor, x, y, 0.1, target=bad(y))


def test_a_call_leaves_no_state_on_the_instance(zoo_predictor, batch):
    """Everything per call travels in the AttackCall: the instance is unchanged afterwards,
    and one instance serving two calls gives both the same result."""
    x, y, target = batch
    for name in ("pgd-linf", "square-linf", "apgd-ce", "transfer"):
        attack = default_registry().create("attack", name)
        before = copy.deepcopy({k: v for k, v in vars(attack).items() if k != "_surrogates"})
        first = attack(zoo_predictor, x, y, 0.2)
        after = {k: v for k, v in vars(attack).items() if k != "_surrogates"}
        assert after.keys() == before.keys(), name
        assert torch.equal(attack(zoo_predictor, x, y, 0.2).x_adv, first.x_adv), name


def test_targeted_transfer_runs_the_inner_attack_with_the_targets(zoo_predictor, batch):
    x, y, target = batch
    inner = default_registry().create("attack", "pgd-linf", {"steps": 20})
    transfer = default_registry().create(
        "attack", "transfer", {"surrogate": "mnist-cnn", "attack_config": {"steps": 20}}
    )
    assert transfer.supports_targets()
    direct = inner(zoo_predictor, x, y, 0.3, target=target)
    through = transfer(zoo_predictor, x, y, 0.3, target=target)
    assert torch.equal(through.x_adv, direct.x_adv)


def test_todo_leaves_the_other_samples_clean_with_zero_steps(zoo_predictor, batch):
    x, y, _ = batch
    todo = torch.arange(len(y)) % 3 == 0
    for name in ("pgd-linf", "square-linf"):
        attack = default_registry().create("attack", name, {"steps": 5} if name[0] == "p" else {})
        result = attack(zoo_predictor, x, y, 0.3, todo=todo)
        assert torch.equal(result.x_adv[~todo], x[~todo])
        assert (result.steps[~todo] == 0).all() and (result.steps[todo] > 0).any()


def test_query_attacks_spend_nothing_on_misclassified_samples(zoo_predictor, batch):
    """The shared preamble of the query attacks lives in the base class: samples the clean
    logits show misclassified, and every sample at eps 0, cost no query."""
    x, y, _ = batch
    wrong_labels = (y + 1) % 10
    for name in ("square-linf", "square-l2", "spsa", "nattack", "boundary"):
        cls = default_registry().get("attack", name)
        assert cls.skips_misclassified, name
        attack = cls()
        result = attack(zoo_predictor, x[:4], wrong_labels[:4], 0.3)
        assert (result.steps == 0).all() and torch.equal(result.x_adv, x[:4]), name
        result = attack(zoo_predictor, x[:4], y[:4], 0.0)
        assert (result.steps == 0).all(), name


def _legacy_plugin() -> type[Attack]:
    """A plugin written for the older four-argument ``perturb``: deprecated, still runs,
    untargeted."""

    class LegacyPlugin(Attack):
        name = "legacy-plugin"
        family = AttackFamily.GRADIENT
        norm = Norm.LINF
        requires = Capability.LABELS

        def perturb(self, predictor, x, y, eps):
            return x + eps, torch.ones(len(x), dtype=torch.long)

    return LegacyPlugin


def test_a_four_argument_plugin_is_deprecated_still_runs_and_refuses_targets(zoo_predictor, batch):
    x, y, target = batch
    with pytest.warns(DeprecationWarning, match=r"perturb\(predictor, x, y, eps, call\)"):
        legacy = _legacy_plugin()
    result = legacy()(zoo_predictor, x, y, 0.1)
    assert torch.equal(result.x_adv, (x + (x + 0.1 - x).clamp(-0.1, 0.1)).clamp(0, 1))
    with pytest.raises(InputError, match="untargeted only"):
        legacy()(zoo_predictor, x, y, 0.1, target=target)


def test_the_current_signature_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Current(Attack):
            name = "current"
            family = AttackFamily.GRADIENT
            norm = Norm.LINF
            requires = Capability.LABELS

            def perturb(self, predictor, x, y, eps, call):
                return x, torch.zeros(len(x), dtype=torch.long)

    assert Current._takes_call


def test_an_attack_cannot_override_call():
    """``__call__`` owns the checks (typing.final, and enforced when the class is made)."""
    with pytest.raises(PluginError, match="overrides __call__.*implement perturb"):

        class Sneaky(Attack):  # noqa: F841
            name = "sneaky"
            family = AttackFamily.GRADIENT
            norm = Norm.LINF
            requires = Capability.LABELS

            def perturb(self, predictor, x, y, eps, call):
                return x, torch.zeros(len(x), dtype=torch.long)

            def __call__(self, predictor, x, y, eps, **kwargs):
                return super().__call__(predictor, x, y, eps)


def test_attack_call_select_keeps_the_rows():
    call = AttackCall(
        torch.Generator(), torch.arange(4), torch.randn(4, 10), torch.tensor([1, 2, 3, 4])
    )
    part = call.select(torch.tensor([1, 3]))
    assert part.samples.tolist() == [1, 3] and part.target.tolist() == [2, 4]
    assert torch.equal(part.clean_logits, call.clean_logits[[1, 3]])
    assert part.generator is call.generator and part.targeted


# --- threat models -----------------------------------------------------------------------------


@pytest.mark.parametrize("threat", [LinfThreat(), L2Threat(), L1Threat()])
@pytest.mark.parametrize("surface", [False, True])
def test_random_starts_lie_in_the_ball_and_the_box(threat, surface):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(32, 1, 8, 8, generator=gen)
    eps = {Norm.LINF: 0.1, Norm.L2: 1.0, Norm.L1: 5.0}[threat.norm]
    start = threat.random_start(x, eps, gen, surface=surface)
    order = {Norm.LINF: math.inf, Norm.L2: 2, Norm.L1: 1}[threat.norm]
    sizes = torch.linalg.vector_norm((start - x).flatten(1), ord=order, dim=1)
    assert float(sizes.max()) <= eps * (1 + 1e-5)
    assert float(start.min()) >= 0 and float(start.max()) <= 1
    assert float(sizes.min()) > 0


def test_linf_projection_is_clip_to_ball_then_box_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(16, 1, 6, 6, generator=gen)
    candidate = x + 0.5 * torch.randn(16, 1, 6, 6, generator=gen)
    ball_then_box = torch.min(torch.max(candidate, x - 0.2), x + 0.2).clamp(0, 1)
    assert torch.equal(LinfThreat().project(candidate, x, 0.2), ball_then_box)


def test_l2_projection_is_the_closest_point_of_ball_and_box_as_scipy_finds_it():
    """Against scipy's SLSQP on the convex QP min ||z - v||^2, ||z - x|| <= eps, 0 <= z <= 1,
    and never farther from ``v`` than either shortcut (shrink-then-clip, clip-then-shrink)."""
    scipy_optimize = pytest.importorskip("scipy.optimize")
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(12, 1, 3, 3, generator=gen, dtype=torch.float64)
    x[:4] = (x[:4] > 0.5).double()  # saturated pixels, where the shortcuts differ most
    v = x + 0.8 * torch.randn(12, 1, 3, 3, generator=gen, dtype=torch.float64)
    v[-2:] = (x[-2:] + 0.01).clamp(0, 1)  # already inside both sets: unchanged
    eps = 0.6
    z = L2Threat().contain(v, x, eps)
    sizes = torch.linalg.vector_norm((z - x).flatten(1), dim=1)
    assert float(sizes.max()) <= eps + 1e-12 and 0 <= float(z.min()) <= float(z.max()) <= 1
    assert torch.equal(z[-2:], v[-2:])
    rows = zip(z.flatten(1).numpy(), v.flatten(1).numpy(), x.flatten(1).numpy(), strict=True)
    for zi, vi, xi in rows:
        found = scipy_optimize.minimize(
            lambda q, vi=vi: ((q - vi) ** 2).sum(),
            xi,
            jac=lambda q, vi=vi: 2 * (q - vi),
            bounds=[(0, 1)] * len(xi),
            constraints=[{"type": "ineq", "fun": lambda q, xi=xi: eps**2 - ((q - xi) ** 2).sum()}],
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        assert zi == pytest.approx(found.x, abs=1e-5)

    def onto_ball(delta):
        size = torch.linalg.vector_norm(delta.flatten(1), dim=1)
        return delta * (eps / size).clamp(max=1).view(-1, 1, 1, 1)

    shrink_then_clip = (x + onto_ball(v - x)).clamp(0, 1)
    clip_then_shrink = x + onto_ball(v.clamp(0, 1) - x)
    for shortcut in (shrink_then_clip, clip_then_shrink):
        distance = torch.linalg.vector_norm((shortcut - v).flatten(1), dim=1)
        assert (torch.linalg.vector_norm((z - v).flatten(1), dim=1) <= distance + 1e-12).all()


@pytest.mark.parametrize("norm", [Norm.LINF, Norm.L2, Norm.L1])
def test_ascent_direction_has_unit_size_in_the_dual_sense(norm):
    grad = torch.randn(4, 1, 5, 5, generator=torch.Generator().manual_seed(2))
    direction = threat_model(norm).ascent(grad)
    assert ((direction * grad).flatten(1).sum(1) > 0).all()  # an ascent direction
    order = {Norm.LINF: math.inf, Norm.L2: 2, Norm.L1: 1}[norm]
    sizes = torch.linalg.vector_norm(direction.flatten(1), ord=order, dim=1)
    assert torch.allclose(sizes, torch.ones(4))
