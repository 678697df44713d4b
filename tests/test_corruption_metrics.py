"""Corruption metrics (mCE, RmCE, mFP, mFR): exact values from hand-set predictions, invariants
(an always-right model has mCE = RmCE = 0, an always-wrong one mCE = the number of severities
and RmCE = 0, a model against itself has mFR = 1), one corrupted set per (corruption,
severity) shared by mCE and RmCE, and agreement with the registered corruption attacks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.corruption.attacks import GaussianNoise
from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError
from aisafety.evaluation import context as context_module
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.corrupted import flip_probability
from aisafety.evaluation.metrics.corruption import (
    MeanCorruptionError,
    MeanFlipProbability,
    MeanFlipRate,
    RelativeMeanCorruptionError,
)
from aisafety.prediction.torch_module import TorchPredictor


class ConstantModule(nn.Module):
    """Always predicts ``label`` whatever the input."""

    def __init__(self, label: int, classes: int = 3):
        super().__init__()
        self.register_buffer("logits", torch.nn.functional.one_hot(torch.tensor(label), classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.float().expand(len(x), -1)


def constant_context(label: int, true_label: int, n: int = 8) -> EvaluationContext:
    x = torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    data = LoadedDataset("const", x, torch.full((n,), true_label), ("a", "b", "c"))
    model = TorchPredictor(ConstantModule(label), (1, 8, 8), 3, name=f"always-{label}")
    return EvaluationContext(model, data, lambda s: None, batch_size=4)


FEW = {"corruptions": ["gaussian_noise", "contrast"], "severities": [1, 3, 5]}


def test_always_right_model_has_zero_corruption_error():
    ctx = constant_context(label=1, true_label=1)
    assert MeanCorruptionError(FEW).compute(ctx).value == 0.0
    assert RelativeMeanCorruptionError(FEW).compute(ctx).value == 0.0
    assert MeanFlipProbability({"n_frames": 4}).compute(ctx).value == 0.0


def test_always_wrong_model_has_mce_equal_to_the_number_of_severities():
    ctx = constant_context(label=0, true_label=1)
    assert MeanCorruptionError(FEW).compute(ctx).value == 3.0  # sum over 3 severities of 1.0
    assert RelativeMeanCorruptionError(FEW).compute(ctx).value == 0.0  # as wrong as when clean


@pytest.fixture
def hand_ctx(monkeypatch):
    """Four samples, labels 0..3; predictions per (corruption, severity) set by hand."""
    predictions = {
        ("fog", 1): [0, 1, 2, 3],  # E = 0
        ("fog", 2): [0, 1, 0, 0],  # E = 1/2
        ("snow", 1): [1, 1, 2, 3],  # E = 1/4
        ("snow", 2): [1, 0, 0, 0],  # E = 1
    }
    calls: list[tuple[str, int]] = []

    def fake(predictor, x, name, severity, seed, batch_size):
        calls.append((name, severity))
        return torch.tensor(predictions[(name, severity)])

    monkeypatch.setattr(context_module, "corrupted_predictions", fake)
    x = torch.zeros(4, 1, 2, 2)
    data = LoadedDataset("hand", x, torch.arange(4), tuple("abcd"))

    class FirstPixel(nn.Module):  # clean predictions: 0, 1, 2, 0 -> clean error 1/4
        def forward(self, x):
            return torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 0]), 4).float()[: len(x)]

    model = TorchPredictor(FirstPixel(), (1, 2, 2), 4, name="hand")
    return EvaluationContext(model, data, lambda s: None), calls


def test_mce_and_rmce_exact_and_sharing_one_set_per_corruption_and_severity(hand_ctx):
    ctx, calls = hand_ctx
    config = {"corruptions": ["fog", "snow"], "severities": [1, 2]}
    mce = MeanCorruptionError(config).compute(ctx)
    # CE_fog = 0 + 1/2, CE_snow = 1/4 + 1; mCE = mean = 7/8
    assert mce.value == pytest.approx(7 / 8)
    assert mce.details["per_corruption"] == {"fog": 0.5, "snow": 1.25}
    rmce = RelativeMeanCorruptionError(config).compute(ctx)
    # RCE_c = sum_s (E_sc - 1/4): fog 0.5 - 0.5 = 0, snow 1.25 - 0.5 = 0.75; mean 0.375
    assert rmce.value == pytest.approx(0.375)
    assert sorted(calls) == [("fog", 1), ("fog", 2), ("snow", 1), ("snow", 2)]


def test_flip_probability_by_hand():
    labels = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 2]])
    assert flip_probability(labels, compare_to_first=False) == pytest.approx(1 / 6)
    assert flip_probability(torch.tensor([[0, 1, 1, 0]]), compare_to_first=True) == 2 / 3
    assert flip_probability(torch.tensor([[0, 1, 1, 0]]), compare_to_first=False) == 2 / 3
    assert flip_probability(torch.tensor([[0, 1, 0, 1]]), compare_to_first=True) == 2 / 3
    assert flip_probability(torch.tensor([[0, 1, 0, 1]]), compare_to_first=False) == 1.0


def test_mfr_exact_from_hand_set_frames(monkeypatch):
    frames = {  # (model, reference) labels per frame for 2 samples
        "rotate": ([[0, 1, 1, 1], [2, 2, 2, 2]], [[0, 1, 0, 1], [2, 2, 2, 2]]),  # 1/6 vs 3/6
        "gaussian_noise": ([[0, 0, 1, 0], [1, 1, 1, 1]], [[0, 1, 1, 0], [1, 1, 1, 1]]),  # 1/6, 2/6
    }

    calls: list[str] = []

    def fake(predictors, x, name, n_frames, seed, batch_size):
        assert len(predictors) == 2  # one pass over the sequence for model and reference
        calls.append(name)
        return [torch.tensor(labels) for labels in frames[name]]

    monkeypatch.setattr(context_module, "sequence_predictions", fake)
    ctx = constant_context(label=1, true_label=1, n=2)
    ctx.reference_predictor = ctx.predictor
    config = {"sequences": ["rotate", "gaussian_noise"], "n_frames": 4}
    value = MeanFlipRate(config).compute(ctx)
    assert value.value == pytest.approx(((1 / 6) / (3 / 6) + (1 / 6) / (2 / 6)) / 2)
    assert MeanFlipProbability(config).compute(ctx).value == pytest.approx(1 / 6)
    assert sorted(calls) == ["gaussian_noise", "rotate"]  # mFR and mFP share each sequence


def test_model_against_itself_has_mfr_one(zoo_predictor, mnist_subset):
    ctx = EvaluationContext(
        zoo_predictor, mnist_subset(40), lambda s: None, reference=zoo_predictor
    )
    value = MeanFlipRate({"sequences": ["translate", "scale"], "n_frames": 12}).compute(ctx)
    assert value.details["undefined"] == []
    assert value.value == pytest.approx(1.0)


def test_mfr_without_reference_names_the_fix(zoo_predictor, mnist_subset):
    ctx = EvaluationContext(zoo_predictor, mnist_subset(10), lambda s: None)
    with pytest.raises(ConfigError, match="reference_model"):
        MeanFlipRate({"sequences": ["rotate"], "n_frames": 2}).compute(ctx)


def test_corruption_error_agrees_with_the_corruption_attack(zoo_predictor, mnist_subset):
    """E_{s,c} of the artifact = 1 - robust accuracy of the registered corruption attack."""
    data = mnist_subset(100)  # one attack chunk: the same noise draw as the artifact's
    ctx = EvaluationContext(zoo_predictor, data, lambda s: None, seed=3)
    for severity in (2, 5):
        error = float((ctx.corrupted("gaussian_noise", severity) != data.y).double().mean())
        attack = GaussianNoise({"severity": severity, "seed": 3})
        assert error == pytest.approx(
            1 - attack(zoo_predictor, data.x, data.y, 0.0).robust_accuracy
        )


def test_unknown_corruption_or_severity_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown corruption 'mist'"):
        MeanCorruptionError({"corruptions": ["mist"]})
    with pytest.raises(ConfigError, match="severities"):
        MeanCorruptionError({"severities": [0, 6]})
    with pytest.raises(ConfigError, match="unknown perturbation sequence"):
        MeanFlipRate({"sequences": ["wobble"]})


def test_samples_cap_is_the_metric_on_that_subset(zoo_predictor, mnist_subset):
    data = mnist_subset(60)
    ctx = EvaluationContext(zoo_predictor, data, lambda s: None)
    index = ctx.subset(25)
    assert len(index) == 25 and torch.equal(index, ctx.subset(25))
    sub = LoadedDataset("sub", data.x[index], data.y[index], data.classes)
    small = EvaluationContext(zoo_predictor, sub, lambda s: None)
    config = {"corruptions": ["shot_noise", "fog"], "severities": [2, 5]}
    capped = RelativeMeanCorruptionError({**config, "samples": 25}).compute(ctx)
    assert capped.n_samples == 25
    assert capped.value == RelativeMeanCorruptionError(config).compute(small).value
