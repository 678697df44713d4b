"""Attacks: budgets, determinism, agreement with torchattacks, early stop, projections, errors."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import torchattacks

from aisafety.attack.base import Attack
from aisafety.attack.fgsm import FGSM
from aisafety.attack.pgd import PGDLinf
from aisafety.attack.projection import project, project_l1
from aisafety.attack.threat import L2Threat
from aisafety.corruption import CORRUPTIONS
from aisafety.errors import CapabilityError, ConfigError, InputError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

N_BUDGET = 128  # samples for the budget / determinism checks
N_REF = 500  # samples for the comparison with torchattacks


def _predict(predictor, x: torch.Tensor) -> torch.Tensor:
    """Labels straight from the network, bypassing the predictor and the attack code."""
    with torch.inference_mode():
        return predictor.network(x).argmax(1)


@pytest.fixture(scope="module")
def batch(mnist_subset):
    data = mnist_subset(N_BUDGET)
    return data.x, data.y


@pytest.fixture(scope="module")
def reference(mnist_subset):
    data = mnist_subset(N_REF)
    return data.x, data.y


@pytest.fixture(scope="module")
def our_pgd_reference(zoo_predictor, reference):
    """Our pgd-linf (steps 40, step 0.01, random start) on the reference set, once per eps."""
    x, y = reference
    cache = {}

    def run(eps: float):
        if eps not in cache:
            attack = PGDLinf(steps=40, step_size=0.01, random_start=True)
            cache[eps] = attack(zoo_predictor, x, y, eps)
        return cache[eps]

    return run


# --- budget invariants -------------------------------------------------------------------------

ATTACKS = {
    "fgsm": lambda: FGSM(),
    "pgd": lambda: PGDLinf(steps=10),
}


@pytest.mark.parametrize(("attack_name", "eps"), itertools.product(ATTACKS, (0.1, 0.3)))
def test_output_within_budget_and_box_and_success_confirmed(zoo_predictor, batch, attack_name, eps):
    x, y = batch
    result = ATTACKS[attack_name]()(zoo_predictor, x, y, eps)
    assert result.x_adv.shape == x.shape and result.x_adv.dtype == torch.float32
    assert float((result.x_adv - x).abs().amax()) <= eps + 1e-6
    assert float(result.x_adv.min()) >= 0.0 and float(result.x_adv.max()) <= 1.0
    assert float(result.norms["linf"].max()) <= eps + 1e-6
    # success recomputed independently from the network itself
    adv_pred = _predict(zoo_predictor, result.x_adv)
    assert torch.equal(result.success, adv_pred != y)
    assert torch.equal(result.clean_pred, _predict(zoo_predictor, x))
    assert result.robust_accuracy == pytest.approx(float((adv_pred == y).float().mean()))
    assert result.success.any()  # the model is not robust at these budgets
    assert result.steps.shape == (len(x),) and result.steps.dtype == torch.long
    assert torch.equal(result.x, x) and torch.equal(result.y, y)


@pytest.mark.parametrize("attack_name", ATTACKS)
def test_zero_budget_changes_nothing(zoo_predictor, batch, attack_name):
    x, y = batch
    result = ATTACKS[attack_name]()(zoo_predictor, x, y, 0.0)
    assert torch.equal(result.x_adv, x)
    clean_correct = _predict(zoo_predictor, x) == y
    assert clean_correct.float().mean() > 0.9
    assert not result.success[clean_correct].any()
    assert torch.equal(result.success, ~clean_correct)


def test_same_seed_gives_identical_output_whatever_the_global_rng(zoo_predictor, batch):
    x, y = batch[0][:32], batch[1][:32]
    torch.manual_seed(1)
    first = PGDLinf(steps=3, seed=7)(zoo_predictor, x, y, 0.1)
    torch.manual_seed(2)
    second = PGDLinf(steps=3, seed=7)(zoo_predictor, x, y, 0.1)
    assert torch.equal(first.x_adv, second.x_adv)
    assert torch.equal(first.steps, second.steps)
    fgsm_a = FGSM()(zoo_predictor, x, y, 0.1)
    fgsm_b = FGSM()(zoo_predictor, x, y, 0.1)
    assert torch.equal(fgsm_a.x_adv, fgsm_b.x_adv)


def test_different_seed_gives_a_different_random_start(zoo_predictor, batch):
    x, y = batch[0][:32], batch[1][:32]
    # one tiny step: x_adv is essentially the random start
    a = PGDLinf(steps=1, step_size=1e-4, seed=0)(zoo_predictor, x, y, 0.1)
    b = PGDLinf(steps=1, step_size=1e-4, seed=1)(zoo_predictor, x, y, 0.1)
    differs = (a.x_adv != b.x_adv).float().mean()
    assert differs > 0.5
    # the start is spread over the whole ball, not just its corners or centre
    delta = (a.x_adv - x)[(x > 0.2) & (x < 0.8)]  # pixels the [0, 1] box does not clip
    assert float(delta.abs().max()) == pytest.approx(0.1, abs=2e-3)
    assert 0.03 < float(delta.abs().mean()) < 0.07  # uniform on [-eps, eps]: mean |d| = eps/2
    assert 0.4 < float((delta < 0).float().mean()) < 0.6  # symmetric about the clean input
    # without a random start the seed is irrelevant
    c = PGDLinf(steps=2, random_start=False, seed=0)(zoo_predictor, x, y, 0.1)
    d = PGDLinf(steps=2, random_start=False, seed=1)(zoo_predictor, x, y, 0.1)
    assert torch.equal(c.x_adv, d.x_adv)


class OverBudget(Attack):
    """Returns a candidate far outside the budget and the box: the base class must fix it."""

    name = "over-budget"
    family = AttackFamily.GRADIENT
    requires = Capability.SCORES

    def perturb(self, predictor, x, y, eps, call):
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn(x.shape, generator=gen)
        return x + 3 * noise, torch.zeros(len(x), dtype=torch.long)


@pytest.mark.parametrize(("norm", "eps"), [(Norm.LINF, 0.1), (Norm.L2, 2.0), (Norm.L1, 10.0)])
def test_base_class_projects_any_candidate_into_budget_and_box(zoo_predictor, batch, norm, eps):
    attack = type(f"OverBudget{norm.value}", (OverBudget,), {"norm": norm})()
    x, y = batch[0][:32], batch[1][:32]
    result = attack(zoo_predictor, x, y, eps)
    size = result.norms[norm.value]
    assert float(size.max()) <= eps * (1 + 1e-5)
    assert float(size.min()) > 0
    assert float(result.x_adv.min()) >= 0.0 and float(result.x_adv.max()) <= 1.0
    assert torch.equal(result.success, _predict(zoo_predictor, result.x_adv) != y)


# --- agreement with torchattacks ---------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_pgd_robust_accuracy_no_worse_than_torchattacks(
    zoo_predictor, reference, our_pgd_reference, eps
):
    x, y = reference
    ours = our_pgd_reference(eps)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        attack = torchattacks.PGD(zoo_predictor.network, eps=eps, alpha=0.01, steps=40)
        # 125 at a time, as our attacks chunk on a CPU: the images of one batch of 500, bit
        # for bit (random starts drawn in order; checked at both eps), in 0.8 of its CPU time
        x_ref = torch.cat([attack(*part) for part in zip(x.split(125), y.split(125), strict=True)])
    assert float((x_ref - x).abs().amax()) <= eps + 1e-6
    reference_accuracy = float((_predict(zoo_predictor, x_ref) == y).float().mean())
    # within one point of the reference, or stronger (lower robust accuracy)
    assert ours.robust_accuracy <= reference_accuracy + 0.01, (
        ours.robust_accuracy,
        reference_accuracy,
    )
    assert ours.robust_accuracy < float((_predict(zoo_predictor, x) == y).float().mean())


@pytest.mark.parametrize("eps", [0.1, 0.2, 0.3])
def test_fgsm_matches_torchattacks(zoo_predictor, reference, eps):
    x, y = reference
    ours = FGSM()(zoo_predictor, x, y, eps)
    x_ref = torchattacks.FGSM(zoo_predictor.network, eps=eps)(x, y)
    ours_correct = int((ours.adv_pred == y).sum())
    reference_correct = int((_predict(zoo_predictor, x_ref) == y).sum())
    assert abs(ours_correct - reference_correct) <= 1, (ours_correct, reference_correct)
    # deterministic, same formula: the images agree up to a sign flip on a zero gradient
    assert float((ours.x_adv != x_ref).float().mean()) < 1e-3


# --- early stop --------------------------------------------------------------------------------


def test_early_stop_same_accuracy_fewer_steps(zoo_predictor, reference, our_pgd_reference):
    x, y = reference
    eps = 0.1
    full = our_pgd_reference(eps)
    early = PGDLinf(steps=40, step_size=0.01, random_start=True, early_stop=True)(
        zoo_predictor, x, y, eps
    )
    assert early.robust_accuracy == pytest.approx(full.robust_accuracy, abs=0.01)
    assert torch.equal(full.steps, torch.full_like(full.steps, 40))
    assert int(early.steps.sum()) < int(full.steps.sum())
    assert int(early.steps.min()) >= 0 and int(early.steps.max()) <= 40
    # a sample stops only once it is misclassified, and then it is not moved again
    assert early.success[early.steps < 40].all()
    assert float((early.x_adv - x).abs().amax()) <= eps + 1e-6
    assert float(early.x_adv.min()) >= 0.0 and float(early.x_adv.max()) <= 1.0


# --- projections -------------------------------------------------------------------------------


def duchi_l1(v: np.ndarray, eps: float) -> np.ndarray:
    """Euclidean projection onto the l1 ball (Duchi et al. 2008, Fig. 1), in numpy."""
    if np.abs(v).sum() <= eps:
        return v.copy()
    u = np.sort(np.abs(v))[::-1]
    css = np.cumsum(u)
    rho = np.nonzero(u * np.arange(1, len(u) + 1) > css - eps)[0][-1]
    theta = (css[rho] - eps) / (rho + 1.0)
    return np.sign(v) * np.maximum(np.abs(v) - theta, 0.0)


@pytest.mark.parametrize(
    ("v", "eps", "expected"),
    [
        ([3.0, 1.0], 2.0, [2.0, 0.0]),
        ([-3.0, 1.0], 2.0, [-2.0, 0.0]),
        ([1.0, 1.0], 1.0, [0.5, 0.5]),
        ([0.5, -0.25], 1.0, [0.5, -0.25]),  # inside: unchanged
        ([2.0, -1.0, 0.5], 1.0, [1.0, 0.0, 0.0]),
        ([1.0, 1.0, -1.0, 0.0], 1.5, [0.5, 0.5, -0.5, 0.0]),
        ([0.3, -0.7], 0.0, [0.0, 0.0]),
    ],
)
def test_project_l1_known_answers(v, eps, expected):
    out = project_l1(torch.tensor([v], dtype=torch.float64), eps)
    assert out[0].tolist() == pytest.approx(expected, abs=1e-12)


def test_project_l1_matches_2d_brute_force():
    """Closest point of a dense sampling of the l1 ball, for random 2-D points."""
    eps = 1.0
    grid = np.linspace(-eps, eps, 801)
    gx, gy = np.meshgrid(grid, grid)
    ball = np.stack([gx.ravel(), gy.ravel()], 1)
    ball = ball[np.abs(ball).sum(1) <= eps + 1e-12]
    rng = np.random.default_rng(0)
    for v in rng.normal(0, 2, size=(20, 2)):
        best = ball[np.argmin(((ball - v) ** 2).sum(1))]
        out = project_l1(torch.tensor(v[None]), eps)[0].numpy()
        assert np.abs(out).sum() <= eps + 1e-12  # feasible
        # no sampled point of the ball is closer to v, and the best one is next to it
        assert np.linalg.norm(out - v) <= np.linalg.norm(best - v) + 1e-12
        assert np.abs(out - best).max() <= 2 * (grid[1] - grid[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_project_l1_random_matches_numpy_duchi(dtype):
    gen = torch.Generator().manual_seed(0)
    delta = torch.randn(64, 1, 5, 5, generator=gen, dtype=torch.float64)
    delta[::4] *= 0.01  # some samples start inside the ball
    eps = 2.0
    out = project_l1(delta.to(dtype), eps)
    assert out.shape == delta.shape and out.dtype == dtype
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    outside = delta.flatten(1).abs().sum(1) > eps
    assert 0 < int(outside.sum()) < len(delta)  # both cases are exercised
    for v, w in zip(delta.flatten(1).numpy(), out.flatten(1).double().numpy(), strict=True):
        np.testing.assert_allclose(w, duchi_l1(v, eps), atol=tol)
        if np.abs(v).sum() > eps:
            assert np.abs(w).sum() == pytest.approx(eps, abs=tol * 25)
        else:
            np.testing.assert_allclose(w, v, atol=tol)
    assert bool((out.flatten(1).abs().sum(1) <= eps + 25 * tol).all())
    # signs are kept: the projection never moves a value across zero
    assert bool((out * delta.to(dtype) >= 0).all())


def test_project_l1_with_ties_and_zeros():
    v = np.array([1.0, -1.0, 1.0, 0.0, 0.0, 0.25])
    out = project_l1(torch.tensor(v[None]), 1.2)[0].numpy()
    np.testing.assert_allclose(out, duchi_l1(v, 1.2), atol=1e-12)
    assert np.abs(out).sum() == pytest.approx(1.2)


def test_project_l2_is_a_radial_shrink():
    gen = torch.Generator().manual_seed(1)
    x = torch.full((8, 1, 4, 4), 0.5)
    delta = 0.2 * torch.randn(8, 1, 4, 4, generator=gen)
    delta[0] *= 1e-3  # inside the ball: unchanged
    eps = 0.3
    out = project(x + delta, x, eps, Norm.L2) - x
    sizes = delta.flatten(1).norm(dim=1)
    assert float(sizes[0]) < eps and torch.allclose(out[0], delta[0], atol=1e-7)
    outside = sizes > eps
    assert outside[1:].all()
    new_sizes = out.flatten(1).norm(dim=1)
    assert torch.allclose(new_sizes[outside], torch.full_like(new_sizes[outside], eps), atol=1e-5)
    expected = delta * (eps / sizes).clamp(max=1).view(-1, 1, 1, 1)
    assert torch.allclose(out, expected, atol=1e-6)  # same direction, shrunk


def test_l2_projection_clips_to_the_box_first_then_shrinks_onto_the_ball():
    """The l2 step rule and the base class's final guarantee (the exact projection) both lie
    in both sets and, on saturated pixels, keep the full budget that ball-then-box (the
    guarantee's rule until the exact projection replaced it) would clip away."""
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 0, 0] = 1.0  # a saturated pixel; a step pushing it up is clipped away
    step = torch.tensor([[[[1.0, 1.0], [0.0, 0.0]]]])
    out = L2Threat().project(x + step, x, 0.5)
    assert out.min() >= 0 and out.max() <= 1
    assert float((out - x).norm()) == pytest.approx(0.5)  # whole budget on the free pixel
    assert float(out[0, 0, 0, 1]) == pytest.approx(0.5)
    guaranteed = project(x + step, x, 0.5, Norm.L2)  # the base class's exact projection
    assert torch.allclose(guaranteed, out, atol=1e-6)
    ball_then_box = (x + step * 0.5 / step.norm()).clamp(0, 1)  # radial shrink, then clip
    assert float((ball_then_box - x).norm()) == pytest.approx(0.5 / 2**0.5, abs=1e-6)


def test_project_linf_clamps_to_ball_then_box():
    x = torch.tensor([[[[0.5, 0.95, 0.02, 0.5]]]])
    candidate = torch.tensor([[[[0.9, 1.3, -0.5, 0.45]]]])
    out = project(candidate, x, 0.1, Norm.LINF)
    assert out.flatten().tolist() == pytest.approx([0.6, 1.0, 0.0, 0.45], abs=1e-6)
    # no norm: only the [0, 1] box
    out = project(candidate, x, 0.1, None)
    assert out.flatten().tolist() == pytest.approx([0.9, 1.0, 0.0, 0.45], abs=1e-6)


@pytest.mark.parametrize("norm", [Norm.L1, Norm.L2, Norm.LINF])
def test_project_result_always_within_budget_and_box(norm):
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(16, 1, 6, 6, generator=gen)
    candidate = x + torch.randn(16, 1, 6, 6, generator=gen)
    eps = {Norm.L1: 3.0, Norm.L2: 1.0, Norm.LINF: 0.2}[norm]
    out = project(candidate, x, eps, norm)
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    order = {Norm.L1: 1, Norm.L2: 2, Norm.LINF: float("inf")}[norm]
    sizes = (out - x).flatten(1).norm(p=order, dim=1)
    assert float(sizes.max()) <= eps * (1 + 1e-5)


# --- errors ------------------------------------------------------------------------------------


class ScoresOnly(Predictor):
    """A model seen only through its scores: no gradients for white-box attacks."""

    name = "scores-only-mnist"
    capabilities = frozenset({Capability.LABELS, Capability.SCORES})
    input_shape = (1, 28, 28)
    num_classes = 10

    def __init__(self, inner: Predictor):
        self.inner = inner

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner._logits(x).detach()


@pytest.mark.parametrize("attack_cls", [FGSM, PGDLinf])
def test_gradient_attack_on_scores_only_model_raises_capability_error(
    zoo_predictor, batch, attack_cls
):
    attack: Attack = attack_cls()
    assert attack.requires is Capability.GRADIENTS
    x, y = batch[0][:4], batch[1][:4]
    with pytest.raises(CapabilityError) as info:
        attack(ScoresOnly(zoo_predictor), x, y, 0.1)
    message = str(info.value)
    assert "scores-only-mnist" in message and attack.name in message
    assert "gradients" in message


def _bad_inputs(x: torch.Tensor, y: torch.Tensor):
    nan = x.clone()
    nan[0, 0, 3, 3] = float("nan")
    return {
        "nan": (nan, y, 0.1),
        "inf": (x.masked_fill(x > 0.5, float("inf")), y, 0.1),
        "above one": (x * 2 + 0.01, y, 0.1),
        "below zero": (x - 0.5, y, 0.1),
        "0-255 scale": (x * 255, y, 0.1),
        "no batch dim": (x[0], y[:1], 0.1),
        "wrong size": (x[:, :, :27, :27].contiguous(), y, 0.1),
        "channels last": (x.permute(0, 2, 3, 1).contiguous(), y, 0.1),
        "float64": (x.double(), y, 0.1),
        "label too big": (x, y.clone().fill_(10), 0.1),
        "negative label": (x, y.clone().fill_(-1), 0.1),
        "labels 2-D": (x, y[:, None], 0.1),
        "labels too few": (x, y[:-1], 0.1),
        "float labels": (x, y.float(), 0.1),
        "negative eps": (x, y, -0.1),
        "nan eps": (x, y, float("nan")),
    }


BAD_INPUT_CASES = list(_bad_inputs(torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)))


@pytest.mark.parametrize("attack_name", ATTACKS)
@pytest.mark.parametrize("case", BAD_INPUT_CASES)
def test_bad_inputs_raise_input_error(zoo_predictor, batch, attack_name, case):
    x, y = batch[0][:4], batch[1][:4]
    args = _bad_inputs(x, y)[case]
    with pytest.raises(InputError):
        ATTACKS[attack_name]()(zoo_predictor, *args)


def test_integer_labels_of_any_width_are_accepted(zoo_predictor, batch):
    x, y = batch[0][:8], batch[1][:8]
    reference = FGSM()(zoo_predictor, x, y, 0.1)
    for dtype in (torch.int32, torch.int16, torch.uint8):
        result = FGSM()(zoo_predictor, x, y.to(dtype), 0.1)
        assert torch.equal(result.x_adv, reference.x_adv)
        assert torch.equal(result.success, reference.success)


@pytest.mark.parametrize(
    ("attack_cls", "config"),
    [
        (FGSM, {"epsilon": 0.1}),
        (PGDLinf, {"stepsize": 0.01}),
        (PGDLinf, {"steps": 0}),
        (PGDLinf, {"step_size": -0.01}),
        (PGDLinf, {"random_start": "sometimes"}),
    ],
)
def test_bad_attack_config_raises_config_error(attack_cls, config):
    with pytest.raises(ConfigError) as info:
        attack_cls(config)
    assert attack_cls.name in str(info.value)
    assert next(iter(config)) in str(info.value)


def test_result_does_not_depend_on_chunking(zoo_predictor, mnist_subset):
    """One random stream runs across chunks: chunk size changes nothing."""
    data = mnist_subset(96)
    x, y = data.x, data.y
    attack = PGDLinf(steps=5, seed=3)
    whole = attack(zoo_predictor, x, y, 0.2, chunk_size=96)
    chunked = attack(zoo_predictor, x, y, 0.2, chunk_size=32)
    assert torch.equal(whole.x_adv, chunked.x_adv)
    assert torch.equal(whole.success, chunked.success)


def test_clean_logits_handed_over_are_used_and_match_a_standalone_call(zoo_predictor, mnist_subset):
    """An evaluation hands over the clean logits it computed once: the result is the same as
    a standalone call's, which computes them itself; the chunks get their own rows."""
    data = mnist_subset(48)
    x, y = data.x, data.y
    attack = PGDLinf(steps=3, seed=1)
    alone = attack(zoo_predictor, x, y, 0.1, chunk_size=16)
    given = attack(zoo_predictor, x, y, 0.1, chunk_size=16, clean_logits=alone.clean_logits)
    assert torch.equal(given.clean_logits, alone.clean_logits)
    assert torch.equal(given.x_adv, alone.x_adv) and torch.equal(given.success, alone.success)
    marked = alone.clean_logits + torch.arange(48.0)[:, None]  # row i shifted by i
    shifted = attack(zoo_predictor, x, y, 0.1, chunk_size=16, clean_logits=marked)
    assert torch.equal(shifted.clean_logits, marked)


def test_clean_logits_of_the_wrong_shape_raise_input_error(zoo_predictor, batch):
    x, y = batch
    with pytest.raises(InputError, match="clean_logits must have shape"):
        PGDLinf(steps=1)(zoo_predictor, x, y, 0.1, clean_logits=torch.zeros(len(x) - 1, 10))


# --- the listing ---------------------------------------------------------------------------------

# what each family may need from the model: white-box attacks gradients, black-box ones scores
# or labels only, transfer and corruptions no more than labels
FAMILY_NEEDS = {
    AttackFamily.GRADIENT: {Capability.GRADIENTS},
    AttackFamily.SCORE: {Capability.SCORES},
    AttackFamily.DECISION: {Capability.LABELS},
    AttackFamily.TRANSFER: {Capability.LABELS},
}


def test_list_attacks_json_shows_family_norm_and_capability_of_every_attack(capsys):
    """``aisafety list attacks --format json`` has one entry per registered attack, with the
    class's own family, norm and required capability, each a valid value."""
    from aisafety.cli import main
    from aisafety.plugins import default_registry

    assert main(["list", "attacks", "--format", "json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    registry = default_registry()
    assert set(listed) == set(registry.names("attack"))
    for name, entry in listed.items():
        cls = registry.get("attack", name)
        family, requires = AttackFamily(entry["family"]), Capability(entry["requires"])
        assert (family, requires) == (cls.family, cls.requires), name
        assert requires in FAMILY_NEEDS[family], (name, family, requires)
        assert Norm(entry["norm"]) is cls.norm, name  # every attack's budget has a norm
    assert {AttackFamily(e["family"]) for e in listed.values()} == set(AttackFamily)
    assert not set(listed) & set(CORRUPTIONS)  # corruptions are not attacks (corruptions:)
    assert {"fgsm", "pgd-linf", "pgd-l2", "pgd-l1", "square-linf", "boundary"} <= set(listed)
