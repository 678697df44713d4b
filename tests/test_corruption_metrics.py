"""Corruption metrics (mCE, RmCE, mFP, mFR): exact values from hand-set predictions, invariants
(an always-right model has mCE = RmCE = 0, an always-wrong one mCE = the number of severities
and RmCE = 0, a model against itself has mFR = 1), one corrupted set per (corruption,
severity) shared by mCE and RmCE, and agreement with the registered corruption attacks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.config import plan_from_dict
from aisafety.corruption import corrupt
from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError, UnknownNameError
from aisafety.evaluation import context as context_module
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.corrupted import flip_probability
from aisafety.evaluation.metrics.corruption import (
    MeanCorruptionError,
    MeanFlipProbability,
    MeanFlipRate,
    RelativeMeanCorruptionError,
)
from aisafety.interfaces import CorruptionsSpec
from aisafety.prediction.torch_module import TorchPredictor


class ConstantModule(nn.Module):
    """Always predicts ``label`` whatever the input."""

    def __init__(self, label: int, classes: int = 3):
        super().__init__()
        self.register_buffer("logits", torch.nn.functional.one_hot(torch.tensor(label), classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.float().expand(len(x), -1)


FEW = CorruptionsSpec(names=("gaussian_noise", "contrast"), severities=(1, 3, 5))


def constant_context(label: int, true_label: int, n: int = 8) -> EvaluationContext:
    x = torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    data = LoadedDataset("const", x, torch.full((n,), true_label), ("a", "b", "c"))
    model = TorchPredictor(ConstantModule(label), (1, 8, 8), 3, name=f"always-{label}")
    return EvaluationContext(model, data, lambda s: None, batch_size=4, corruptions=FEW)


def test_always_right_model_has_zero_corruption_error():
    ctx = constant_context(label=1, true_label=1)
    assert MeanCorruptionError().compute(ctx)[0].value == 0.0
    assert RelativeMeanCorruptionError().compute(ctx)[0].value == 0.0
    assert MeanFlipProbability({"n_frames": 4}).compute(ctx)[0].value == 0.0


def test_always_wrong_model_has_mce_equal_to_the_number_of_severities():
    ctx = constant_context(label=0, true_label=1)
    assert MeanCorruptionError().compute(ctx)[0].value == 3.0  # sum over 3 severities of 1.0
    assert RelativeMeanCorruptionError().compute(ctx)[0].value == 0.0  # as wrong as when clean


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

    def fake(predictor, x, name, severity, seed, batch_size, table):
        calls.append((name, severity))
        return torch.tensor(predictions[(name, severity)])

    monkeypatch.setattr(context_module, "corrupted_predictions", fake)
    x = torch.zeros(4, 1, 2, 2)
    data = LoadedDataset("hand", x, torch.arange(4), tuple("abcd"))

    class FirstPixel(nn.Module):  # clean predictions: 0, 1, 2, 0 -> clean error 1/4
        def forward(self, x):
            return torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 0]), 4).float()[: len(x)]

    model = TorchPredictor(FirstPixel(), (1, 2, 2), 4, name="hand")
    section = CorruptionsSpec(names=("fog", "snow"), severities=(1, 2))
    return EvaluationContext(model, data, lambda s: None, corruptions=section), calls


def test_mce_and_rmce_exact_and_sharing_one_set_per_corruption_and_severity(hand_ctx):
    ctx, calls = hand_ctx
    mce = MeanCorruptionError().compute(ctx)[0]
    # CE_fog = 0 + 1/2, CE_snow = 1/4 + 1; mCE = mean = 7/8
    assert mce.value == pytest.approx(7 / 8)
    assert mce.details["per_corruption"] == {"fog": 0.5, "snow": 1.25}
    rmce = RelativeMeanCorruptionError().compute(ctx)[0]
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
    value = MeanFlipRate(config).compute(ctx)[0]
    assert value.value == pytest.approx(((1 / 6) / (3 / 6) + (1 / 6) / (2 / 6)) / 2)
    assert MeanFlipProbability(config).compute(ctx)[0].value == pytest.approx(1 / 6)
    assert sorted(calls) == ["gaussian_noise", "rotate"]  # mFR and mFP share each sequence


def test_model_against_itself_has_mfr_one(zoo_predictor, mnist_subset):
    ctx = EvaluationContext(
        zoo_predictor, mnist_subset(40), lambda s: None, reference=zoo_predictor
    )
    value = MeanFlipRate({"sequences": ["translate", "scale"], "n_frames": 12}).compute(ctx)[0]
    assert value.details["undefined"] == []
    assert value.value == pytest.approx(1.0)


def test_mfr_without_reference_names_the_fix(zoo_predictor, mnist_subset):
    ctx = EvaluationContext(zoo_predictor, mnist_subset(10), lambda s: None)
    with pytest.raises(ConfigError, match="reference_model"):
        MeanFlipRate({"sequences": ["rotate"], "n_frames": 2}).compute(ctx)[0]


def test_corruption_error_agrees_with_corrupting_by_hand(zoo_predictor, mnist_subset):
    """E_{s,c} of the artifact = the error of the model on ``corrupt(x)`` at the plan's seed."""
    data = mnist_subset(100)  # one chunk: the same noise draw as the artifact's
    ctx = EvaluationContext(zoo_predictor, data, lambda s: None, seed=3)
    for severity in (2, 5):
        error = float((ctx.corrupted("gaussian_noise", severity) != data.y).double().mean())
        by_hand = zoo_predictor.predict(corrupt(data.x, "gaussian_noise", severity, seed=3))
        assert error == pytest.approx(float((by_hand != data.y).double().mean()))


def test_deprecated_metric_config_still_works_with_a_warning(hand_ctx):
    """The old form, mce/rmce config keys, overrides the plan's section and warns."""
    ctx, _ = hand_ctx
    with pytest.warns(FutureWarning, match="corruptions: section"):
        mce = MeanCorruptionError({"corruptions": ["snow"], "severities": [2]})
    assert mce.compute(ctx)[0].value == 1.0  # E_snow,2 = 1
    assert mce.compute(ctx)[0].details["per_corruption"] == {"snow": 1.0}


def test_unknown_corruption_or_severity_is_a_clear_error(hand_ctx):
    with pytest.raises(ConfigError, match="unknown corruption 'mist'"):
        MeanCorruptionError({"corruptions": ["mist"]})
    with pytest.raises(ConfigError, match="severities"):
        MeanCorruptionError({"severities": [0, 6]})
    with pytest.raises(ConfigError, match="unknown perturbation sequence"):
        MeanFlipRate({"sequences": ["wobble"]})
    with pytest.raises(ConfigError, match="severities"):
        plan_from_dict({"corruptions": {"severities": [0, 6]}})
    with pytest.raises(ConfigError, match="table"):
        plan_from_dict({"corruptions": {"table": "cifar-100-c"}})
    ctx, _ = hand_ctx
    ctx.corruptions = CorruptionsSpec(names=("mist",))
    with pytest.raises(UnknownNameError, match="unknown corruption 'mist'"):
        MeanCorruptionError().compute(ctx)[0]


def test_samples_cap_is_the_metric_on_that_subset(zoo_predictor, mnist_subset):
    data = mnist_subset(60)
    section = CorruptionsSpec(names=("shot_noise", "fog"), severities=(2, 5))
    ctx = EvaluationContext(
        zoo_predictor, data, lambda s: None, corruptions=section.model_copy(update={"samples": 25})
    )
    index = ctx.subset(25)
    assert len(index) == 25 and torch.equal(index, ctx.subset(25))
    sub = LoadedDataset("sub", data.x[index], data.y[index], data.classes)
    small = EvaluationContext(zoo_predictor, sub, lambda s: None, corruptions=section)
    capped = RelativeMeanCorruptionError().compute(ctx)[0]
    assert capped.n_samples == 25
    assert capped.value == RelativeMeanCorruptionError().compute(small)[0].value


def test_the_plan_table_selects_the_severity_table(zoo_predictor, mnist_subset):
    """The same 28-px digits with the ImageNet-C table (sigma 0.08-0.38) err more than with
    the CIFAR-10-C one (0.04-0.10), which auto picks at this size."""
    data = mnist_subset(100)
    errors = {}
    for table in ("auto", "cifar10-c", "imagenet-c"):
        section = CorruptionsSpec(names=("gaussian_noise",), severities=(5,), table=table)
        ctx = EvaluationContext(zoo_predictor, data, lambda s: None, corruptions=section)
        value = MeanCorruptionError().compute(ctx)[0]
        assert value.details["table"] == table
        errors[table] = value.value
    assert errors["auto"] == errors["cifar10-c"] < errors["imagenet-c"]


def test_the_plan_section_drives_mce_through_the_runner(tmp_path, zoo_predictor):
    """corruptions: in a plan reaches the metric; another table is another unit of work, so
    --resume does not hand back the first table's values."""
    from aisafety.interfaces import DatasetSpec, EvaluationPlan, MetricSpec
    from aisafety.runner import Runner
    from aisafety.store.results import ResultStore

    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    section = {"names": ["shot_noise"], "severities": [5], "table": "cifar10-c"}
    plan = EvaluationPlan(
        dataset=DatasetSpec(limit=40),
        metrics=(MetricSpec(name="mce"),),
        corruptions=section,
        device="cpu",
    )
    first = Runner(plan, store, quiet=True).run().values[0]
    assert first.details["per_corruption"].keys() == {"shot_noise"}
    assert first.details["severities"] == [5] and first.details["table"] == "cifar10-c"
    other = plan.model_copy(
        update={"corruptions": CorruptionsSpec(**{**section, "table": "imagenet-c"})}
    )
    second = Runner(other, store, quiet=True, resume=True).run()
    assert second.resumed_units == 0 and second.values[0].details["table"] == "imagenet-c"


def test_a_corruption_under_attacks_is_refused_naming_the_corruptions_key(tmp_path, capsys):
    """The deprecation has ended: a corruption under attacks: is a ConfigError that names the
    corruptions: key, and the command line exits 2 with it before any work."""
    from aisafety.cli import main
    from aisafety.interfaces import AttackSpec, EvaluationPlan
    from aisafety.runner import Runner
    from aisafety.store.results import ResultStore

    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    plan = EvaluationPlan(attacks=(AttackSpec(name="fog", eps=0.0),), device="cpu")
    with pytest.raises(
        ConfigError, match=r"'fog' is a corruption.*corruptions: \{names: \[fog\]\}"
    ):
        Runner(plan, store, quiet=True)
    path = tmp_path / "plan.yaml"
    path.write_text("attacks:\n  - {name: fog, eps: [0.0]}\nmetrics: [ca]\ndevice: cpu\n")
    assert main(["evaluate", str(path), "--db", f"sqlite:///{tmp_path / 'c.db'}"]) == 2
    err = capsys.readouterr().err
    assert "corruptions:" in err and "Traceback" not in err
    with pytest.raises(UnknownNameError):  # a name that is no corruption either: the usual error
        Runner(EvaluationPlan(attacks=(AttackSpec(name="mist", eps=0.0),)), store, quiet=True)
