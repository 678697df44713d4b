"""Defense-cost metrics (CAV, CRR, CSR, CCV, COS): exact values on a hand-built pair of models
with known logits, scipy's Jensen-Shannon distance as the independent reference for COS,
invariants on the zoo models, and the plan's ``reference_model`` contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from torch import nn

from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.zoo import load_zoo_model
from aisafety.errors import ConfigError
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.defense_cost import (
    ClassificationAccuracyVariance,
    ClassificationConfidenceVariance,
    ClassificationOutputStability,
    ClassificationRectifyRatio,
    ClassificationSacrificeRatio,
    jensen_shannon,
)
from aisafety.interfaces import EvaluationPlan
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


class TableModule(nn.Module):
    """Logits looked up by the sample's index, stored in pixel 0 of a 1x1x1 image."""

    def __init__(self, logits: np.ndarray):
        super().__init__()
        self.register_buffer("table", torch.from_numpy(logits).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = (x.flatten(1)[:, 0] * 10).round().long()
        return self.table[index]


def table_predictor(logits: np.ndarray, name: str) -> TorchPredictor:
    return TorchPredictor(TableModule(logits), (1, 1, 1), logits.shape[1], name=name)


LABELS = np.array([0, 1, 2, 0, 1, 2])
# reference f: right on 0, 1, 4, 5; defended f^d: right on 0, 2, 4
REFERENCE = np.array(
    [[2.0, 0.0, 0.0], [0.0, 1.5, 0.5], [1.0, 0.0, 0.5], [0.0, 2.0, 0.0], [0.3, 0.9, 0.0],
     [0.0, 0.0, 3.0]]
)  # fmt: skip
DEFENDED = np.array(
    [[1.0, 0.5, 0.0], [0.0, 0.2, 0.8], [0.0, 0.0, 0.4], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0],
     [2.0, 0.0, 1.0]]
)  # fmt: skip


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.fixture
def hand_ctx() -> EvaluationContext:
    x = torch.arange(len(LABELS), dtype=torch.float32).view(-1, 1, 1, 1) / 10
    data = LoadedDataset("hand", x, torch.from_numpy(LABELS), ("a", "b", "c"))
    reference = table_predictor(REFERENCE, "reference")
    return EvaluationContext(
        table_predictor(DEFENDED, "defended"), data, lambda s: None, reference=reference
    )


def test_hand_case_is_as_intended():
    assert np.flatnonzero(REFERENCE.argmax(1) == LABELS).tolist() == [0, 1, 4, 5]
    assert np.flatnonzero(DEFENDED.argmax(1) == LABELS).tolist() == [0, 2, 4]


def test_cav_crr_csr_exact(hand_ctx):
    assert ClassificationAccuracyVariance().compute(hand_ctx)[0].value == pytest.approx(
        3 / 6 - 4 / 6
    )
    assert ClassificationRectifyRatio().compute(hand_ctx)[0].value == pytest.approx(
        1 / 6
    )  # sample 2
    assert ClassificationSacrificeRatio().compute(hand_ctx)[0].value == pytest.approx(2 / 6)  # 1, 5


def test_ccv_and_cos_exact_over_samples_both_models_get_right(hand_ctx):
    both = [0, 4]
    p, q = softmax(REFERENCE)[both], softmax(DEFENDED)[both]
    y = LABELS[both]
    ccv = ClassificationConfidenceVariance().compute(hand_ctx)[0]
    assert ccv.n_samples == 2
    assert ccv.value == pytest.approx(np.abs(p[[0, 1], y] - q[[0, 1], y]).mean(), abs=1e-7)
    cos = ClassificationOutputStability().compute(hand_ctx)[0]
    # scipy's jensenshannon is the square root of the divergence (natural log by default)
    expected = np.mean([jensenshannon(p[i], q[i]) ** 2 for i in range(2)])
    assert cos.value == pytest.approx(expected, abs=1e-7)
    assert cos.details["reference"] == "reference"


def test_jensen_shannon_bounds_and_one_hot_rows():
    one_hot = torch.eye(3, dtype=torch.float64)
    shifted = one_hot.roll(1, dims=1)
    assert torch.allclose(jensen_shannon(one_hot, one_hot), torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(
        jensen_shannon(one_hot, shifted), torch.full((3,), np.log(2), dtype=torch.float64)
    )


def test_identical_models_cost_nothing(zoo_predictor, mnist_subset):
    data = mnist_subset(200)
    ctx = EvaluationContext(zoo_predictor, data, lambda s: None, reference=zoo_predictor)
    for metric in (
        ClassificationAccuracyVariance(),
        ClassificationRectifyRatio(),
        ClassificationSacrificeRatio(),
        ClassificationConfidenceVariance(),
        ClassificationOutputStability(),
    ):
        assert metric.compute(ctx)[0].value == pytest.approx(0.0, abs=1e-12), metric.name


def test_crr_minus_csr_is_cav_on_zoo_models(zoo_predictor, mnist_subset):
    data = mnist_subset(300)
    defended = load_zoo_model("mnist-cnn-pgd-at")
    ctx = EvaluationContext(defended, data, lambda s: None, reference=zoo_predictor)
    cav = ClassificationAccuracyVariance().compute(ctx)[0].value
    crr = ClassificationRectifyRatio().compute(ctx)[0].value
    csr = ClassificationSacrificeRatio().compute(ctx)[0].value
    assert crr - csr == pytest.approx(cav, abs=1e-12)
    assert 0 <= ClassificationOutputStability().compute(ctx)[0].value <= np.log(2)


def test_metric_needing_a_reference_without_one_is_a_clear_error():
    plan = EvaluationPlan(metrics=["ca", "cav"])
    with pytest.raises(ConfigError, match="metric 'cav'.*reference_model"):
        Runner(plan, ResultStore("sqlite://"))


def test_runner_loads_the_reference_once_and_stores_defense_costs():
    plan = EvaluationPlan.model_validate(
        {
            "model": {"name": "mnist-cnn-pgd-at"},
            "reference_model": {"name": "mnist-cnn"},
            "dataset": {"limit": 50},
            "metrics": ["ca", "cav", "crr", "csr"],
        }
    )
    store = ResultStore("sqlite://")
    values = {v.metric: v.value for v in Runner(plan, store, quiet=True).run().values}
    assert values["crr"] - values["csr"] == pytest.approx(values["cav"])
    _, rows = store.query("SELECT metric, value FROM results WHERE metric = 'cav'")
    assert rows == [("cav", pytest.approx(values["cav"]))]


class _Pooled(nn.Module):
    """Channel means -> ``classes`` logits."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(3, classes)

    def forward(self, x):
        return self.linear(x.mean((2, 3)))


def hundred_classes() -> nn.Module:
    return _Pooled(100)


def test_a_reference_of_another_class_count_is_refused(tmp_path):
    """A 100-class reference against a 10-class model stored cav and crr (0.1 each on 20
    CIFAR-10 images) without a word: the reference's predictions of classes the data lacks
    counted as its errors."""
    import aisafety

    reference = {"name": "wide", "source": "python", "factory": f"{__name__}:hundred_classes"}
    plan = {
        "device": "cpu",
        "dataset": {"name": "cifar10-embedded", "limit": 4},
        "reference_model": {**reference, "input_shape": [3, 32, 32]},
        "metrics": ["ca", "cav", "crr"],
    }
    model = TorchPredictor(_Pooled(10), (3, 32, 32), 10, name="ten")
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(plan, f"sqlite:///{tmp_path / 'r.db'}", model=model)
    assert str(caught.value).startswith(
        "reference model 'wide' has 100 classes and the evaluated model 'ten' has 10: the "
        "metrics that read the reference (cav, crr, csr, ccv, cos, mfr) compare the two "
        "models class by class"
    )


def test_a_reject_class_model_against_its_reference_wrapped_as_documented():
    """docs/metrics.md: a defended model with an extra (reject) class is compared with its
    reference given a score no class reaches; the reference's predictions and probabilities
    stay those of the hand case, so CAV, CRR and CSR are its values."""
    x = torch.arange(len(LABELS), dtype=torch.float32).view(-1, 1, 1, 1) / 10
    data = LoadedDataset("hand", x, torch.from_numpy(LABELS), ("a", "b", "c"))
    reject = np.concatenate([DEFENDED, np.full((6, 1), -5.0)], 1)  # never its answer here
    wrapped = np.concatenate([REFERENCE, np.full((6, 1), -1e4)], 1)
    ctx = EvaluationContext(
        table_predictor(reject, "defended"),
        data,
        lambda s: None,
        reference=table_predictor(wrapped, "reference"),
    )
    np.testing.assert_allclose(ctx.reference.probs[:, :3].numpy(), softmax(REFERENCE), atol=1e-7)
    assert ctx.reference.probs[:, 3].max() == 0
    assert ClassificationAccuracyVariance().compute(ctx)[0].value == pytest.approx(3 / 6 - 4 / 6)
    assert ClassificationRectifyRatio().compute(ctx)[0].value == pytest.approx(1 / 6)
    assert ClassificationSacrificeRatio().compute(ctx)[0].value == pytest.approx(2 / 6)
