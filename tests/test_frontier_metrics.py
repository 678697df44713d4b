"""RDI, ROBY and adversarial hypervolume: hand-computed values on synthetic features and
frontiers, the exact frontier of a linear model, and the comparison statistics against scipy."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats
from torch import nn

from aisafety.cli import main
from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.features import extract_features
from aisafety.evaluation.frontier import adversarial_frontier, probability_margin
from aisafety.evaluation.metrics.feature_separation import (
    RobustnessDifferenceIndex,
    Roby,
    rdi,
    roby,
)
from aisafety.evaluation.metrics.hypervolume import AdversarialHypervolume, hypervolume
from aisafety.evaluation.ranking import (
    metric_columns,
    rank_correlations,
    rank_sum_tests,
    undefined_correlations,
)
from aisafety.interfaces import Direction, MetricValue, Norm
from aisafety.prediction.torch_module import TorchPredictor


def points(*xy: tuple[float, float]) -> torch.Tensor:
    return torch.tensor(xy, dtype=torch.float64)


# --- RDI -------------------------------------------------------------------------------------


def test_rdi_by_hand():
    # class 0 around (0, 0) at distance 1, class 1 around (4, 0) at distance 2:
    # IntraD = (1 + 2) / 2 = 1.5; E_0 = (2, 0), InterD = 2; RDI = (2 - 1.5) / 2
    vectors = points((0, 1), (0, -1), (4, 2), (4, -2))
    parts = rdi(vectors, torch.tensor([0, 0, 1, 1]))
    assert parts["intra_d"] == pytest.approx(1.5)
    assert parts["inter_d"] == pytest.approx(2.0)
    assert parts["rdi"] == pytest.approx(0.25)
    # classes closer than they are wide: centres (0, 0), (1, 0), InterD 0.5 < IntraD 1.5
    close = points((0, 1), (0, -1), (1, 2), (1, -2))
    assert rdi(close, torch.tensor([0, 0, 1, 1]))["rdi"] == pytest.approx((0.5 - 1.5) / 1.5)


def test_rdi_groups_by_label_given_and_ignores_absent_classes():
    vectors = points((0, 1), (0, -1), (4, 2), (4, -2))
    # labels 3 and 7 (classes 0-2, 4-6, 8, 9 never predicted): the same two groups
    assert rdi(vectors, torch.tensor([3, 3, 7, 7]))["rdi"] == pytest.approx(0.25)
    assert rdi(vectors, torch.tensor([3, 3, 7, 7]))["classes"] == 2


# --- ROBY ------------------------------------------------------------------------------------


def test_roby_by_hand():
    # class 0: (0,0), (2,0) -> centre (1,0), distances 1, 1
    # class 1: (10,0), (10,4) -> centre (10,2), distances 2, 2
    # class 2: (0,10) -> centre itself, distance 0
    vectors = points((0, 0), (2, 0), (10, 0), (10, 4), (0, 10))
    labels = torch.tensor([0, 0, 1, 1, 2])
    fsa = [0.5, 1.0, 0.0]  # mean of the distances min-max scaled over [0, 2]
    d01, d02, d12 = math.sqrt(85), math.sqrt(101), math.sqrt(164)
    fsd = {(0, 1): 0.0, (0, 2): (d02 - d01) / (d12 - d01), (1, 2): 1.0}
    pair = {(i, j): fsa[i] + fsa[j] - fsd[(i, j)] for i, j in fsd}  # 1.5, 0.268..., 0.0
    low, high = min(pair.values()), max(pair.values())
    expected = sum((v - low) / (high - low) for v in pair.values()) / 3
    assert roby(vectors, labels)["roby"] == pytest.approx(expected)
    assert expected == pytest.approx(0.39300, abs=1e-5)


# --- features and the metric objects ---------------------------------------------------------


class TwoDimHead(nn.Module):
    """Features = the image's two pixels, through an identity layer, then a linear head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Identity())
        self.head = nn.Linear(2, 2)
        with torch.no_grad():  # class 1 when the first pixel exceeds 0.5
            self.head.weight.copy_(torch.tensor([[-10.0, 0.0], [10.0, 0.0]]))
            self.head.bias.copy_(torch.tensor([5.0, -5.0]))

    def forward(self, x):
        return self.head(self.body(x))


def test_rdi_metric_reads_the_head_input_and_predicted_labels():
    pixels = torch.tensor([[0.1, 0.5], [0.1, 0.3], [0.9, 0.6], [0.9, 0.2], [0.6, 0.4]])
    model = TorchPredictor(TwoDimHead(), (1, 1, 2), 2, name="two-dim")
    labels = torch.tensor([0, 0, 1, 1, 0])  # the last sample is predicted 1, not 0
    data = LoadedDataset("hand", pixels.view(-1, 1, 1, 2), labels, ("a", "b"))
    ctx = EvaluationContext(model, data, lambda s: None)
    features = extract_features(model, data.x)
    assert torch.equal(features.predicted, torch.tensor([0, 0, 1, 1, 1]))
    assert torch.allclose(features.vectors, pixels.double())
    expected = rdi(pixels.double(), torch.tensor([0, 0, 1, 1, 1]))["rdi"]
    value = RobustnessDifferenceIndex().compute(ctx)[0]
    assert value.value == pytest.approx(expected)
    assert (value.direction, value.n_samples, value.details["feature_dim"]) == (
        Direction.HIGHER, 5, 2,
    )  # fmt: skip
    # a named layer (the identity's output) gives the same features; the logits differ
    assert RobustnessDifferenceIndex(layer="body.1").compute(ctx)[0].value == pytest.approx(
        expected
    )
    assert Roby(layer="logits").compute(ctx)[0].details["layer"] == "logits"
    with pytest.raises(ConfigError, match="no such layer"):
        RobustnessDifferenceIndex(layer="nope").compute(ctx)[0]


def test_rdi_and_roby_on_the_zoo_model(zoo_predictor, mnist_subset):
    ctx = EvaluationContext(zoo_predictor, mnist_subset(200), lambda s: None)
    value = RobustnessDifferenceIndex().compute(ctx)[0]
    assert -1 <= value.value <= 1 and value.details["feature_dim"] == 100
    assert value.details["classes"] == 10
    assert 0 <= Roby().compute(ctx)[0].value <= 1


# --- adversarial hypervolume -----------------------------------------------------------------


def test_hypervolume_of_closed_form_frontiers():
    n = 10
    levels = torch.arange(1, n + 1, dtype=torch.float64) / n
    # F(t) = 1 - t sampled at the right ends: sum (1/N)(1 - i/N) = (N - 1) / (2N)
    linear = (1 - levels)[None]
    assert hypervolume(levels, linear).item() == pytest.approx((n - 1) / (2 * n))
    assert hypervolume(levels, torch.ones(1, n, dtype=torch.float64)).item() == pytest.approx(1)
    # eq. 4 is a union of boxes: a higher point at a larger budget dominates the smaller ones
    assert hypervolume(
        torch.tensor([0.5, 1.0], dtype=torch.float64), torch.tensor([[0.2, 0.6]]).double()
    ).item() == pytest.approx(0.6)
    # an uneven grid: widths 0.25 and 0.75
    assert hypervolume(
        torch.tensor([0.25, 1.0], dtype=torch.float64), torch.tensor([[0.8, 0.4]]).double()
    ).item() == pytest.approx(0.25 * 0.8 + 0.75 * 0.4)


class Linear2(nn.Module):
    """Two classes, logit gap g(x) = w . x + b for class 1 over class 0."""

    def __init__(self, w: torch.Tensor, b: float):
        super().__init__()
        self.w, self.b = w, b

    def forward(self, x):
        gap = x.flatten(1) @ self.w + self.b
        return torch.stack([torch.zeros_like(gap), gap], 1)


@pytest.mark.parametrize("norm", [Norm.LINF, Norm.L2])
def test_frontier_of_a_linear_model_is_exact(norm):
    w = torch.tensor([2.0, -1.0, 0.5, 1.5])
    model = TorchPredictor(Linear2(w, -0.2), (1, 2, 2), 2, name="linear")
    x = torch.full((3, 1, 2, 2), 0.5)
    x[1] += 0.1  # gap 0.5 w.sum() - 0.2 + 0.1 * w.sum()
    x[2] -= 0.4  # clean gap 0.1 * 3 - 0.2 = 0.1 > 0 ... for class 1
    y = torch.tensor([1, 1, 0])  # sample 2 is labelled 0 but predicted 1: misclassified
    budgets = tuple(0.03 * i for i in range(1, 11))
    found = adversarial_frontier(model, x, y, budgets, norm, steps=5)
    size = w.abs().sum() if norm is Norm.LINF else w.norm()
    gaps = x.flatten(1) @ w - 0.2
    for i in range(2):
        # 2 classes: p_1 - p_0 = tanh(gap / 2); the worst point in the ball lowers the gap by
        # eps ||w||_1 (l-inf) or eps ||w||_2 (l2), inside [0, 1] here
        exact = [math.tanh(gaps[i].item() / 2)] + [
            max(0.0, math.tanh((gaps[i] - eps * size).item() / 2)) for eps in budgets
        ]
        assert found.margins[i].tolist() == pytest.approx(exact, abs=1e-5)
    assert found.margins[2].tolist() == [0.0] * 11  # misclassified at budget 0
    per_sample = hypervolume(torch.tensor(budgets, dtype=torch.float64) / 0.3, found.margins[:, 1:])
    assert per_sample[2].item() == 0.0
    assert per_sample[0].item() == pytest.approx(found.margins[0, 1:].mean().item())


def test_hypervolume_metric_on_the_zoo_model(zoo_predictor, mnist_subset):
    data = mnist_subset(24)
    ctx = EvaluationContext(zoo_predictor, data, lambda s: None, batch_size=16)
    value = AdversarialHypervolume(budgets=4, steps=3).compute(ctx)[0]
    d = value.details
    assert value.eps == 0.3 and value.n_samples == 24 and len(d["per_sample"]) == 24
    assert value.value == pytest.approx(sum(d["per_sample"]) / 24, abs=1e-6)
    assert d["budgets"] == pytest.approx([0, 0.075, 0.15, 0.225, 0.3])
    frontier = torch.tensor(d["frontier"])
    assert frontier.shape == (24, 5)
    assert (frontier.diff(dim=1) <= 0).all() and (frontier >= 0).all() and (frontier <= 1).all()
    with torch.no_grad():
        clean = probability_margin(zoo_predictor.logits(data.x), data.y).clamp_min(0)
    assert frontier[:, 0] == pytest.approx(clean.tolist(), abs=1e-6)
    # robust at eps_max implies robust (margin > 0) when clean
    assert d["robust_accuracy_at_eps_max"] <= float((clean > 0).double().mean())
    l2 = AdversarialHypervolume(norm="l2", eps_max=2.0, budgets=4, steps=3).compute(ctx)[0]
    assert l2.metric == "adversarial-hypervolume(norm=l2,eps_max=2.0,budgets=4,steps=3)"


# --- comparison statistics -------------------------------------------------------------------


def _value(metric, value, direction=Direction.HIGHER, **details) -> MetricValue:
    return MetricValue(
        metric=metric, value=value, direction=direction, n_samples=3, details=details
    )


def test_rank_correlations_and_rank_sum_match_scipy():
    results = {
        "a": [_value("ra", 0.1), _value("rdi", 0.3), _value("ah", 0.2, per_sample=[0.1, 0.2, 0.3])],
        "b": [_value("ra", 0.5), _value("rdi", 0.2), _value("ah", 0.6, per_sample=[0.5, 0.6, 0.7])],
        "c": [_value("ra", 0.9), _value("rdi", 0.1), _value("ah", 0.4, per_sample=[0.3, 0.4, 0.5])],
        "d": [_value("ra", 0.7), _value("rdi", 0.4), _value("ah", 0.3, per_sample=[0.2, 0.3, 0.4])],
    }
    columns = metric_columns(results)
    rows = {(r.first, r.second): r for r in rank_correlations(columns)}
    ra, rdi_values = [0.1, 0.5, 0.9, 0.7], [0.3, 0.2, 0.1, 0.4]
    expected = stats.spearmanr(ra, rdi_values)
    assert rows[("ra", "rdi")].spearman == pytest.approx(expected.statistic)
    assert rows[("ra", "rdi")].kendall == pytest.approx(stats.kendalltau(ra, rdi_values).statistic)
    assert rows[("ra", "rdi")].spearman == pytest.approx(-0.4)  # d^2 sum 14: 1 - 6*14/60
    assert undefined_correlations(columns) is None
    tests = {t.model: t for t in rank_sum_tests(results, "a")}
    scipy_b = stats.ranksums([0.5, 0.6, 0.7], [0.1, 0.2, 0.3])
    assert tests["b"].p_value == pytest.approx(scipy_b.pvalue)
    # all of b's samples above all of a's: z = 1.964, p = 0.0495 (normal approximation)
    assert tests["b"].statistic > 0 and tests["b"].verdict == "+"
    assert tests["d"].verdict == "="  # overlapping samples
    assert set(tests) == {"b", "c", "d"}


def test_undefined_rank_correlations_are_left_out_and_said():
    def results(models, constant=False):
        return {m: [_value("ra", 0.1 * i), _value("rdi", 0.5 if constant else 0.2 * i)]
                for i, m in enumerate(models)}  # fmt: skip

    two = metric_columns(results(["a", "b"]))
    assert rank_correlations(two) == []
    assert "needs at least 3 models and 2 were compared" in undefined_correlations(two)
    flat = metric_columns(results(["a", "b", "c"], constant=True))  # rdi equal on every model
    assert rank_correlations(flat) == []
    assert "1 of 1 pairs of metrics left out" in undefined_correlations(flat)
    defined = metric_columns(results(["a", "b", "c"]))
    assert [r.spearman for r in rank_correlations(defined)] == [pytest.approx(1.0)]
    assert undefined_correlations(defined) is None


def test_compare_command_runs_two_models(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "dataset: {name: mnist-embedded, limit: 20}\n"
        "attacks: [{name: fgsm, eps: [0.1]}]\n"
        "metrics: [ca, rdi, robust-accuracy, "
        "{name: adversarial-hypervolume, config: {budgets: 2, steps: 2}}]\n"
    )
    db = f"sqlite:///{tmp_path / 'c.db'}"
    code = main(["compare", str(plan), "--models", "mnist-cnn", "mnist-cnn-pgd-at",
                 "--db", db, "--quiet"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "robust-accuracy @ fgsm eps=0.1" in out
    # two models have no rank correlation: a line says so, no table of nan (issue #36)
    assert "spearman" not in out and "nan" not in out
    assert "needs at least 3 models and 2 were compared" in out
    assert "Wilcoxon rank-sum" in out and "mnist-cnn-pgd-at" in out
    assert main(["compare", str(plan), "--models", "mnist-cnn", "--db", db]) == 2


def test_compare_with_the_plan_after_models_fails_before_any_work(tmp_path, capsys):
    # argparse reads a plan given after --models as one more model name
    db = tmp_path / "c.db"
    code = main(["compare", "--models", "mnist-cnn", "mnist-cnn-pgd-at", "sok.yaml",
                 "--db", f"sqlite:///{db}"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "'sok.yaml' is not a zoo model" in err and "before --models" in err
    assert not db.exists()  # nothing ran: not even the first model under the default plan


# --- AH training's frontier examples (eq. 3's clamp) ---------------------------------------


def test_clamped_frontier_examples_stop_at_misclassification():
    from aisafety.defense.training.hypervolume import frontier_examples

    network = Linear2(torch.tensor([1.0, 1.0, 1.0, 1.0]), -2.0)  # class 1 when sum x > 2
    x = torch.tensor([0.45, 0.56]).repeat_interleave(4).view(2, 1, 2, 2)  # sums 1.8 and 2.24
    y = torch.tensor([1, 1])  # the first sample is already misclassified
    clamped = frontier_examples(network, x, y, 0.2, steps=3, step_size=0.05, clamp_margin=True)
    free = frontier_examples(network, x, y, 0.2, steps=3, step_size=0.05)
    assert torch.equal(clamped[0], x[0])  # L_MAR_conf = 0 there: no gradient, no move
    assert torch.allclose(free[0], x[0] - 0.15)  # the unclamped margin keeps descending
    # the correct sample crosses the boundary at the second step (sum 2.24 -> 2.04 -> 1.84);
    # clamped, it stops there
    assert torch.allclose(clamped[1], x[1] - 0.1) and torch.allclose(free[1], x[1] - 0.15)


def test_trades_examples_of_frontier_points_stay_in_the_clean_points_ball():
    """TRADES's search for a frontier example x' runs in B(x, eps) of its clean x when told
    (AH training's default): around x' itself it reaches 2 eps from x."""
    from aisafety.defense.training.trades import kl_examples

    network = Linear2(torch.ones(4), -2.0)
    x = torch.full((16, 1, 2, 2), 0.5)
    frontier = x - 0.2  # a frontier example at the edge of B(x, 0.2)
    found = {
        ball: kl_examples(network, frontier, 0.2, 4, 0.1, torch.Generator().manual_seed(0), c)
        for ball, c in (("clean", x), ("frontier", None))
    }
    assert (found["clean"] - x).abs().amax() <= 0.2 + 1e-6
    assert (found["frontier"] - frontier).abs().amax() <= 0.2 + 1e-6
    assert (found["frontier"] - x).abs().amax() > 0.3  # some went on away from x


# --- AH on the zoo: does it rank the trained-for-it model first? ----------------------------


def _zoo_hypervolume(name: str, data) -> tuple[MetricValue, torch.Tensor]:
    from aisafety.database.zoo import load_zoo_model

    model = load_zoo_model(name)
    ctx = EvaluationContext(model, data, lambda s: None)
    value = AdversarialHypervolume(budgets=5, steps=5).compute(ctx)[0]
    with torch.no_grad():
        clean = probability_margin(model.logits(data.x), data.y)
    return value, clean


@pytest.fixture(scope="module")
def zoo_hypervolumes(mnist_subset):
    data = mnist_subset(100)
    names = ("mnist-cnn", "mnist-cnn-pgd-at", "mnist-cnn-ah")
    return {name: _zoo_hypervolume(name, data) for name in names}


def test_adversarial_training_raises_hypervolume_significantly(zoo_hypervolumes):
    (vanilla, _), (pgd_at, _) = zoo_hypervolumes["mnist-cnn"], zoo_hypervolumes["mnist-cnn-pgd-at"]
    p = stats.ranksums(pgd_at.details["per_sample"], vanilla.details["per_sample"]).pvalue
    assert pgd_at.value > vanilla.value and p < 0.05


def test_ah_trained_model_beats_vanilla_on_hypervolume(zoo_hypervolumes):
    """The AH paper's Table II finding: its model ahead on AH with rank-sum p < 0.05."""
    (vanilla, _), (ah, _) = zoo_hypervolumes["mnist-cnn"], zoo_hypervolumes["mnist-cnn-ah"]
    p = stats.ranksums(ah.details["per_sample"], vanilla.details["per_sample"]).pvalue
    assert ah.value > vanilla.value and p < 0.05


def test_ah_trained_model_is_robust_and_its_ah_is_bounded_by_its_clean_margin(zoo_hypervolumes):
    (vanilla, vanilla_clean), (ah, ah_clean) = (
        zoo_hypervolumes[m] for m in ("mnist-cnn", "mnist-cnn-ah")
    )
    # it keeps far more samples correct at eps_max ...
    at_max = "robust_accuracy_at_eps_max"
    assert ah.details[at_max] > vanilla.details[at_max] + 0.3
    # ... and AH, an average of margins each <= the clean one, cannot exceed the clean margin
    for value, clean in ((ah, ah_clean), (vanilla, vanilla_clean)):
        assert value.value <= float(clean.clamp_min(0).mean()) + 1e-6
