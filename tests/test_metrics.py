"""Metrics: exact values on hand-built cases, invariants on the zoo model, context caching.

Hand cases use a linear predictor with hand-set weights and a fake attack that returns
adversarial inputs chosen in advance, so every logit and probability is known exactly and the
expected metric values are computed here by hand (fractions) or with numpy / scikit-image,
independently of the code under test. Convention (DEEPSEC, as documented in the metrics):
ACAC / ACTC / NTE / ALD / ASS average over *successful* examples = clean-correct and
adversarially wrong; AAW is robust accuracy over all samples.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity
from torch import nn

from aisafety.attack.base import Attack
from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.accuracy import AdversarialAccuracyWhiteBox, CleanAccuracy
from aisafety.evaluation.metrics.adversarial_confidence import (
    AverageConfidenceAdversarialClass,
    AverageConfidenceTrueClass,
    NoiseToleranceEstimation,
)
from aisafety.evaluation.metrics.imperceptibility import (
    AverageLpDistortion,
    AverageStructuralSimilarity,
)
from aisafety.interfaces import AttackFamily, AttackSpec, Capability, Norm
from aisafety.prediction.torch_module import TorchPredictor

# --- helpers -----------------------------------------------------------------------------------


class FixedAttack(Attack):
    """Returns, for each clean input it is given, an adversarial input chosen in advance.

    Rows are looked up by value, so the context may hand it the data in any batching.
    Its l-inf budget is used at eps 1 (the whole [0, 1] box): the base class's projection
    leaves the chosen inputs, which lie in [0, 1], unchanged.
    """

    name = "fixed"
    family = AttackFamily.GRADIENT
    norm = Norm.LINF
    requires = Capability.SCORES

    def __init__(self, clean: torch.Tensor, adversarial: torch.Tensor):
        super().__init__()
        self.clean, self.adversarial = clean, adversarial
        self.calls = 0

    def perturb(self, predictor, x, y, eps, call):
        self.calls += 1
        table = self.clean.flatten(1)
        rows = [int(torch.nonzero((table == row).all(1))[0, 0]) for row in x.flatten(1)]
        return self.adversarial[rows].clone(), torch.ones(len(x), dtype=torch.long)


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def linear_predictor(weight: np.ndarray, input_shape, name: str) -> TorchPredictor:
    classes, features = weight.shape
    layer = nn.Linear(features, classes)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight).float())
        layer.bias.zero_()
    return TorchPredictor(nn.Sequential(nn.Flatten(), layer), input_shape, classes, name=name)


def fixed_context(predictor, clean, labels, adversarial, batch_size=128):
    data = LoadedDataset("hand", clean, labels, tuple(map(str, range(predictor.num_classes))))
    made: list[FixedAttack] = []

    def make_attack(spec: AttackSpec) -> Attack:
        made.append(FixedAttack(clean, adversarial))
        return made[-1]

    return EvaluationContext(predictor, data, make_attack, batch_size=batch_size), made


# l-inf budget 1: the whole [0, 1] box, so the base class's projection keeps every chosen
# input as it is (the hand cases move pixels by more than 0.5)
SPEC = AttackSpec(name="fixed", eps=(1.0,))
EPS = 1.0

# --- the 2x2 hand case ---------------------------------------------------------------------------
# logits = 2 * (x0, x1, x2); pixel x3 only enters the norms.
W_HAND = np.array([[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0]], dtype=np.float64)
CLEAN = np.array(
    [
        [0.9, 0.1, 0.0, 0.5],  # y=0, clean pred 0 (correct)
        [0.1, 0.8, 0.2, 0.3],  # y=1, clean pred 1 (correct)
        [0.7, 0.2, 0.1, 0.4],  # y=0, clean pred 0 (correct)
        [0.2, 0.9, 0.3, 0.1],  # y=2, clean pred 1 (wrong)
        [0.3, 0.2, 0.6, 0.0],  # y=0, clean pred 2 (wrong)
    ]
)
ADV = np.array(
    [
        [0.2, 0.8, 0.1, 0.5],  # pred 1: successful
        [0.1, 0.3, 0.9, 0.3],  # pred 2: successful
        [0.6, 0.3, 0.1, 0.4],  # pred 0: attack failed (robust)
        [0.1, 0.2, 0.0, 0.1],  # pred 1: wrong, but was wrong already -> not "successful"
        [0.8, 0.2, 0.3, 0.0],  # pred 0: would make a wrong sample right (the clean stands)
    ]
)
LABELS = np.array([0, 1, 0, 2, 0])
SUCCESSFUL = [0, 1]


def as_images(rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(rows).float().view(-1, 1, 2, 2)


@pytest.fixture
def hand_ctx():
    predictor = linear_predictor(W_HAND, (1, 2, 2), "hand-linear")
    ctx, made = fixed_context(predictor, as_images(CLEAN), torch.from_numpy(LABELS), as_images(ADV))
    return ctx, made


def test_hand_case_construction_is_as_intended():
    """Guard for the expectations below: the numpy model predicts what the comments say."""
    clean_pred = (CLEAN @ W_HAND.T).argmax(1)
    adv_pred = (ADV @ W_HAND.T).argmax(1)
    assert clean_pred.tolist() == [0, 1, 0, 1, 2]
    assert adv_pred.tolist() == [1, 2, 0, 1, 0]
    successful = (clean_pred == LABELS) & (adv_pred != LABELS)
    assert np.flatnonzero(successful).tolist() == SUCCESSFUL


def test_clean_accuracy_hand(hand_ctx):
    ctx, made = hand_ctx
    value = CleanAccuracy().compute(ctx)[0]
    assert value.value == pytest.approx(3 / 5)
    assert value.n_samples == 5
    assert not made  # CA needs no attack


def test_aaw_hand_is_robust_accuracy_over_all_samples(hand_ctx):
    ctx, _ = hand_ctx
    value = AdversarialAccuracyWhiteBox().compute(ctx, SPEC, EPS)[0]
    # adversarially correct: sample 2 (attack failed); sample 4's point is right but the
    # sample was wrong clean, so its clean input stands (attack/base.py's
    # keep_clean_mistakes: a clean mistake is its own adversarial example; 2/5 before
    # session 19)
    assert value.value == pytest.approx(1 / 5)
    assert value.n_samples == 5
    assert value.eps == EPS and value.attack == "fixed" and value.attack_key == SPEC.key()


def test_confidence_metrics_hand(hand_ctx):
    ctx, _ = hand_ctx
    # softmax of the adversarial logits of the two successful samples
    p0 = softmax(2 * np.array([0.2, 0.8, 0.1]))  # true 0, adversarial class 1
    p1 = softmax(2 * np.array([0.1, 0.3, 0.9]))  # true 1, adversarial class 2
    expected_acac = (p0[1] + p1[2]) / 2
    expected_actc = (p0[0] + p1[1]) / 2
    expected_nte = ((p0[1] - max(p0[0], p0[2])) + (p1[2] - max(p1[0], p1[1]))) / 2

    acac = AverageConfidenceAdversarialClass().compute(ctx, SPEC, EPS)[0]
    actc = AverageConfidenceTrueClass().compute(ctx, SPEC, EPS)[0]
    nte = NoiseToleranceEstimation().compute(ctx, SPEC, EPS)[0]
    assert acac.value == pytest.approx(expected_acac, rel=1e-6)
    assert actc.value == pytest.approx(expected_actc, rel=1e-6)
    assert nte.value == pytest.approx(expected_nte, rel=1e-6)
    assert acac.n_samples == actc.n_samples == nte.n_samples == 2

    # The value differs from what the excluded samples would give: the mask matters.
    p3 = softmax(2 * ADV[3, :3])
    assert acac.value != pytest.approx((p0[1] + p1[2] + p3.max()) / 3, rel=1e-3)


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        # s0: delta (-.7, .7, .1, 0), x (.9, .1, 0, .5)
        # s1: delta (0, -.5, .7, 0), x (.1, .8, .2, .3)
        ("0", (3 / 3 + 2 / 4) / 2),
        ("1", (1.5 / 1.5 + 1.2 / 1.4) / 2),
        ("2", (math.sqrt(0.99 / 1.07) + math.sqrt(0.74 / 0.78)) / 2),
        ("inf", (0.7 / 0.9 + 0.7 / 0.8) / 2),
    ],
)
def test_ald_hand(hand_ctx, p, expected):
    ctx, _ = hand_ctx
    value = AverageLpDistortion(p=p).compute(ctx, SPEC, EPS)[0]
    assert value.value == pytest.approx(expected, rel=1e-5)
    assert value.n_samples == 2
    # the label tells two configs apart (p=2 is the default, so it has no suffix)
    assert value.metric == ("ald" if p == "2" else f"ald(p={p})")


@pytest.mark.parametrize("p", ["0", "1", "2", "inf"])
def test_ald_hand_matches_numpy_norms(hand_ctx, p):
    ctx, _ = hand_ctx
    order = {"0": 0, "1": 1, "2": 2, "inf": np.inf}[p]
    ratios = [
        np.linalg.norm(ADV[i] - CLEAN[i], ord=order) / np.linalg.norm(CLEAN[i], ord=order)
        for i in SUCCESSFUL
    ]
    value = AverageLpDistortion(p=p).compute(ctx, SPEC, EPS)[0]
    assert value.value == pytest.approx(np.mean(ratios), rel=1e-5)


def test_hand_values_do_not_depend_on_batching():
    predictor = linear_predictor(W_HAND, (1, 2, 2), "hand-linear")
    x, y, adv = as_images(CLEAN), torch.from_numpy(LABELS), as_images(ADV)
    whole, _ = fixed_context(predictor, x, y, adv, batch_size=128)
    chunked, made = fixed_context(predictor, x, y, adv, batch_size=2)
    metrics = [
        CleanAccuracy(),
        AdversarialAccuracyWhiteBox(),
        AverageConfidenceAdversarialClass(),
        AverageConfidenceTrueClass(),
        NoiseToleranceEstimation(),
        *(AverageLpDistortion(p=p) for p in ("0", "1", "2", "inf")),
    ]
    for metric in metrics:
        if isinstance(metric, CleanMetric):
            a, b = metric.compute(whole)[0], metric.compute(chunked)[0]
        else:
            a, b = metric.compute(whole, SPEC, EPS)[0], metric.compute(chunked, SPEC, EPS)[0]
        assert a.value == pytest.approx(b.value, rel=1e-6), metric.label()
        assert a.n_samples == b.n_samples
    assert made[0].calls == 3  # 5 samples in batches of 2
    result = chunked.adversarial(SPEC, EPS)
    kept = adv.clone()
    kept[4] = x[4]  # a clean mistake the fixed point would make right: the clean input stands
    assert torch.allclose(result.x_adv, kept, atol=1e-6)
    assert result.y.tolist() == LABELS.tolist()


def test_no_successful_examples_gives_nan_over_zero_samples():
    """An attack that changes nothing: only the clean-wrong samples are wrong -> m = 0."""
    predictor = linear_predictor(W_HAND, (1, 2, 2), "hand-linear")
    x, y = as_images(CLEAN), torch.from_numpy(LABELS)
    ctx, _ = fixed_context(predictor, x, y, x.clone())
    for metric in (
        AverageConfidenceAdversarialClass(),
        AverageConfidenceTrueClass(),
        NoiseToleranceEstimation(),
        AverageLpDistortion(p="inf"),
    ):
        value = metric.compute(ctx, SPEC, EPS)[0]
        assert math.isnan(value.value) and value.n_samples == 0, metric.label()
    aaw = AdversarialAccuracyWhiteBox().compute(ctx, SPEC, EPS)[0].value
    assert aaw == pytest.approx(CleanAccuracy().compute(ctx)[0].value)


# --- SSIM / ALD on 8x8 images ---------------------------------------------------------------------


def test_ass_and_ald_on_8x8_images_match_skimage_and_numpy():
    # logit k = mean of image row k (k = 0, 1, 2); rows 3..7 never change a prediction
    weight = np.zeros((3, 64))
    for k in range(3):
        weight[k, 8 * k : 8 * k + 8] = 1 / 8
    predictor = linear_predictor(weight, (1, 8, 8), "hand-8x8")

    rng = np.random.default_rng(0)
    clean = rng.uniform(0.1, 0.9, size=(6, 1, 8, 8))
    pred = clean[:, 0, :3, :].mean(2).argmax(1)
    labels = pred.copy()
    labels[5] = (pred[5] + 1) % 3  # sample 5 is misclassified when clean
    adv = clean.copy()
    for i in range(3):  # successful: darken the true row, saturate another one, add texture
        adv[i, 0] = np.clip(adv[i, 0] + rng.normal(0, 0.1, (8, 8)), 0, 1)
        adv[i, 0, labels[i], :] = 0.0
        adv[i, 0, (labels[i] + 1) % 3, :] = 1.0
    adv[3, 0, 3:] = np.clip(adv[3, 0, 3:] + rng.normal(0, 0.2, (5, 8)), 0, 1)  # robust
    # sample 4: robust, unchanged; sample 5: clean-wrong, changed (must be ignored)
    adv[5, 0] = np.clip(adv[5, 0] + rng.normal(0, 0.3, (8, 8)), 0, 1)

    clean_t = torch.from_numpy(clean).float()
    adv_t = torch.from_numpy(adv).float()
    clean64, adv64 = clean_t.double().numpy(), adv_t.double().numpy()  # values the model sees
    flat_w = weight.T
    clean_pred = (clean64.reshape(6, -1) @ flat_w).argmax(1)
    adv_pred = (adv64.reshape(6, -1) @ flat_w).argmax(1)
    successful = np.flatnonzero((clean_pred == labels) & (adv_pred != labels))
    assert successful.tolist() == [0, 1, 2]  # construction guard

    ctx, _ = fixed_context(predictor, clean_t, torch.from_numpy(labels), adv_t)

    expected_ass = np.mean(
        [structural_similarity(adv64[i, 0], clean64[i, 0], data_range=1.0) for i in successful]
    )
    ass = AverageStructuralSimilarity().compute(ctx, SPEC, EPS)[0]
    assert ass.value == pytest.approx(expected_ass, abs=1e-5)
    assert ass.n_samples == 3

    for p, order in (("0", 0), ("1", 1), ("2", 2), ("inf", np.inf)):
        ratios = [
            np.linalg.norm((adv64[i] - clean64[i]).ravel(), ord=order)
            / np.linalg.norm(clean64[i].ravel(), ord=order)
            for i in successful
        ]
        value = AverageLpDistortion(p=p).compute(ctx, SPEC, EPS)[0]
        assert value.value == pytest.approx(np.mean(ratios), rel=1e-5), p

    assert AdversarialAccuracyWhiteBox().compute(ctx, SPEC, EPS)[0].value == pytest.approx(2 / 6)
    assert CleanAccuracy().compute(ctx)[0].value == pytest.approx(5 / 6)


# --- invariants on the zoo model ------------------------------------------------------------------

EPSILONS = (0.05, 0.1, 0.2)
PGD_SPEC = AttackSpec(name="pgd-linf", config={"steps": 20}, eps=EPSILONS)


def make_pgd(spec: AttackSpec) -> Attack:
    assert spec.name == "pgd-linf"
    return PGDLinf(spec.config)


@pytest.fixture(scope="module")
def zoo_ctx(zoo_predictor, mnist_subset):
    """200 class-balanced embedded samples, PGD run once per budget for the whole module."""
    return EvaluationContext(zoo_predictor, mnist_subset(200), make_pgd, batch_size=100)


def _successful(result):
    return (result.clean_logits.argmax(1) == result.y) & (result.adv_logits.argmax(1) != result.y)


def test_zoo_aaw_at_most_ca_and_non_increasing_in_eps(zoo_ctx, zoo_predictor):
    ca = CleanAccuracy().compute(zoo_ctx)[0].value
    with torch.inference_mode():
        recomputed = (zoo_predictor.network(zoo_ctx.x).argmax(1) == zoo_ctx.y).float().mean()
    assert ca == pytest.approx(float(recomputed))
    assert ca >= 0.9  # the shipped model is a working MNIST classifier

    aaw = [AdversarialAccuracyWhiteBox().compute(zoo_ctx, PGD_SPEC, e)[0].value for e in EPSILONS]
    assert all(a <= ca for a in aaw), (ca, aaw)
    assert all(a >= b for a, b in zip(aaw, aaw[1:], strict=False)), aaw
    assert aaw[-1] < aaw[0]  # the attack gets stronger with the budget
    for eps, value in zip(EPSILONS, aaw, strict=True):
        result = zoo_ctx.adversarial(PGD_SPEC, eps)
        with torch.inference_mode():
            adv_pred = zoo_predictor.network(result.x_adv).argmax(1)
        assert value == pytest.approx(float((adv_pred == zoo_ctx.y).float().mean()))


@pytest.mark.parametrize("eps", EPSILONS)
def test_zoo_confidence_metric_ranges(zoo_ctx, eps):
    result = zoo_ctx.adversarial(PGD_SPEC, eps)
    m = int(_successful(result).sum())
    assert m > 0
    acac = AverageConfidenceAdversarialClass().compute(zoo_ctx, PGD_SPEC, eps)[0]
    actc = AverageConfidenceTrueClass().compute(zoo_ctx, PGD_SPEC, eps)[0]
    nte = NoiseToleranceEstimation().compute(zoo_ctx, PGD_SPEC, eps)[0]
    assert acac.n_samples == actc.n_samples == nte.n_samples == m
    # the adversarial class is the arg-max: its probability is >= 1/k and >= the true class's
    assert 1 / 10 <= acac.value <= 1
    assert 0 <= actc.value <= acac.value
    assert acac.value + actc.value <= 1 + 1e-9  # two distinct classes of one distribution
    assert 0 <= nte.value <= acac.value


@pytest.mark.parametrize("eps", EPSILONS)
def test_zoo_ald_invariants(zoo_ctx, eps):
    result = zoo_ctx.adversarial(PGD_SPEC, eps)
    mask = _successful(result)
    x, delta = result.x[mask].double(), (result.x_adv[mask] - result.x[mask]).double()
    assert float(delta.abs().amax()) <= eps + 1e-6
    # ||x_adv - x||_inf / ||x||_inf <= eps / ||x||_inf <= eps / min over successful ||x||_inf
    min_size = float(x.flatten(1).abs().amax(1).min())
    ald = {
        p: AverageLpDistortion(p=p).compute(zoo_ctx, PGD_SPEC, eps)[0].value
        for p in ("0", "1", "2", "inf")
    }
    assert ald["inf"] <= eps / min_size + 1e-6
    # successful examples were correct when clean, so each one was moved: every ALD is > 0
    assert all(v > 0 for v in ald.values()), ald
    expected_l2 = (delta.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1)).mean()
    assert ald["2"] == pytest.approx(float(expected_l2), rel=1e-6)


@pytest.mark.parametrize("eps", EPSILONS)
def test_zoo_ass_in_range(zoo_ctx, eps):
    ass = AverageStructuralSimilarity().compute(zoo_ctx, PGD_SPEC, eps)[0]
    assert ass.n_samples > 0
    assert -1 <= ass.value < 1


class CountingPGD(PGDLinf):
    """pgd-linf that counts its ``perturb`` calls (one per batch)."""

    calls = 0

    def perturb(self, predictor, x, y, eps, call):
        self.calls += 1
        return super().perturb(predictor, x, y, eps, call)


def test_context_runs_each_attack_once_per_budget(zoo_predictor, mnist_subset):
    data = mnist_subset(40)
    spec = AttackSpec(name="pgd-linf", config={"steps": 3}, eps=(0.1,))
    built: list[CountingPGD] = []

    def make_attack(s: AttackSpec) -> Attack:
        built.append(CountingPGD(s.config))
        return built[-1]

    ctx = EvaluationContext(zoo_predictor, data, make_attack, batch_size=16)
    metrics = [
        AdversarialAccuracyWhiteBox(),
        AverageConfidenceAdversarialClass(),
        AverageConfidenceTrueClass(),
        NoiseToleranceEstimation(),
        *(AverageLpDistortion(p=p) for p in ("0", "1", "2", "inf")),
        AverageStructuralSimilarity(),
    ]
    first = [m.compute(ctx, spec, 0.1)[0].value for m in metrics]
    second = [m.compute(ctx, spec, 0.1)[0].value for m in metrics]
    key = (spec.key(), 0.1)
    assert ctx.attack_runs == Counter({key: 1})
    assert len(built) == 1
    assert built[0].calls == 3  # one PGD pass over the 40 samples, in batches of 16
    np.testing.assert_equal(first, second)  # cached: the very same numbers (NaN-safe)
    assert len(ctx.adversarial(spec, 0.1).y) == 40  # the three batches were joined

    # a second budget is a second run; the first stays cached
    AdversarialAccuracyWhiteBox().compute(ctx, spec, 0.05)[0]
    assert ctx.attack_runs == Counter({key: 1, (spec.key(), 0.05): 1})


# --- configuration errors -------------------------------------------------------------------------


def test_ald_with_invalid_p_raises_config_error():
    with pytest.raises(ConfigError, match="ald"):
        AverageLpDistortion(p="3")
    with pytest.raises(ConfigError):
        AverageLpDistortion({"p": "l2"})


def test_unknown_metric_setting_raises_config_error():
    with pytest.raises(ConfigError, match="ca"):
        CleanAccuracy(p="2")
    with pytest.raises(ConfigError):
        AverageLpDistortion(q="2")
