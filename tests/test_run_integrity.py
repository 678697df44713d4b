"""A plugin or model that changes what a run shares fails its own unit, by name, and
changes nobody else's numbers (issue #35, finding 2; aisafety/evaluation/integrity.py,
aisafety/prediction/watch.py)."""

from __future__ import annotations

import sqlite3
import types

import pytest
import torch
from torch import nn

from aisafety.attack.fgsm import FGSM
from aisafety.cli import main
from aisafety.defense.base import InputDefense
from aisafety.errors import TamperingError
from aisafety.evaluation.base import CleanMetric
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import EvaluationPlan, MetricValue
from aisafety.plugins import build_registry
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.prediction.watch import model_tensors
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


class WeightScaler(FGSM):
    """FGSM that also scales every weight of the model it attacks by 0 (through ``.data``,
    which PyTorch's write counters do not see)."""

    name = "weight-scaler"

    def perturb(self, predictor, x, y, eps, call):
        for tensor in model_tensors(predictor).values():
            tensor.data.mul_(0)
        return super().perturb(predictor, x, y, eps, call)


class ContextWriter(CleanMetric):
    """Writes into the images, the labels and the clean logits every unit reads."""

    name = "ctx-writer"
    description = "a careless metric"

    def compute(self, ctx):
        ctx.x[:] = 0
        ctx.y[:] = 0
        ctx.clean_logits.zero_()
        return MetricValue(metric=self.name, value=1.0, direction="higher", n_samples=len(ctx.y))


def _registry():
    module = types.ModuleType("careless")
    module.aisafety_attacks = hookimpl(lambda: [WeightScaler])
    module.aisafety_metrics = hookimpl(lambda: [ContextWriter])
    return build_registry(extra_plugins=[("careless", module)])


def _plan(attacks: list[dict], metrics: list[str]) -> EvaluationPlan:
    return EvaluationPlan.model_validate(
        {"dataset": {"limit": 24}, "attacks": attacks, "metrics": metrics, "device": "cpu"}
    )


FGSM_SPEC = {"name": "fgsm", "eps": [0.1]}
PGD_SPEC = {"name": "pgd-linf", "config": {"steps": 3}, "eps": [0.1]}


def _rows(path, sql: str) -> list[tuple]:
    with sqlite3.connect(path) as connection:
        return connection.execute(sql).fetchall()


def test_a_weight_scaling_attack_and_a_context_writing_metric_fail_only_their_units(tmp_path):
    reference = Runner(
        _plan([FGSM_SPEC, PGD_SPEC], ["ca", "aaw"]), ResultStore(f"sqlite:///{tmp_path / 'a.db'}"),
        quiet=True,
    ).run()  # fmt: skip
    path = tmp_path / "b.db"
    plan = _plan(
        [FGSM_SPEC, {"name": "weight-scaler", "eps": [0.1]}, PGD_SPEC],
        ["ca", "ctx-writer", "aaw"],
    )
    record = Runner(plan, ResultStore(f"sqlite:///{path}"), registry=_registry(), quiet=True).run()

    assert len(record.failed_units) == 2
    clean_failure, attack_failure = record.failed_units
    assert "metric 'ctx-writer' changed the images (ctx.x), the labels (ctx.y)" in clean_failure
    assert "ctx.clean_logits" in clean_failure
    assert "attack 'weight-scaler' at eps=0.1 changed model 'mnist-cnn'" in attack_failure
    # the other attacks' stored values are those of a run without the careless plugins
    expected = {(v.metric, v.attack, v.eps): v.value for v in reference.values if v.attack}
    stored = {
        (metric, attack, eps): value
        for metric, attack, eps, value in _rows(
            path, "SELECT metric, attack, eps, value FROM results"
        )
    }
    assert stored == expected
    outcomes = (
        "SELECT a.attack, o.sample_index, o.adv_pred, o.linf FROM sample_outcomes o "
        "JOIN attack_runs a ON a.id = o.attack_run_id ORDER BY a.attack, o.sample_index"
    )
    assert _rows(path, outcomes) == _rows(tmp_path / "a.db", outcomes)
    # nothing computed after a change is stored: no value of the two failed units
    assert not _rows(path, "SELECT 1 FROM metric_values WHERE metric IN ('ca', 'ctx-writer')")
    assert not _rows(path, "SELECT 1 FROM attack_runs WHERE attack LIKE 'weight-scaler%'")
    assert _rows(path, "SELECT status FROM runs") == [("failed",)]
    assert len(_rows(path, "SELECT key FROM unit_failures")) == 2


class _WritesItsInput(TorchPredictor):
    def _logits(self, x):
        x.mul_(0)
        return super()._logits(x)


class _UpdatesItsWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        with torch.no_grad():
            self.linear.weight.mul_(0.5)
        return self.linear(x.flatten(1))


def test_a_model_that_writes_into_its_input_is_named():
    predictor = _WritesItsInput(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), (1, 2, 2), 3,
                                name="zeroing-model")  # fmt: skip
    x = torch.rand(2, 1, 2, 2)
    with pytest.raises(TamperingError, match="model 'zeroing-model' wrote into its input"):
        predictor.logits(x)


@pytest.mark.parametrize(
    "module", [_UpdatesItsWeights(), nn.Sequential(nn.Flatten(), nn.BatchNorm1d(4))]
)
def test_a_model_that_changes_its_weights_or_buffers_is_named(module):
    classes = 3 if isinstance(module, _UpdatesItsWeights) else 4
    predictor = TorchPredictor(module, (1, 2, 2), classes, name="drifting")
    module.train()  # a BatchNorm in training mode updates its running statistics
    with pytest.raises(TamperingError, match="model 'drifting' changed its own weights or buffers"):
        predictor.logits(torch.rand(2, 1, 2, 2))


def test_an_honest_model_passes_and_costs_no_copy():
    predictor = TorchPredictor(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), (1, 2, 2), 3)
    x = torch.rand(2, 1, 2, 2)
    before = x.clone()
    with torch.inference_mode():
        predictor.logits(x)
    predictor.logits(x.requires_grad_())
    assert torch.equal(x.detach(), before)


class Crashing(FGSM):
    name = "crashing"

    def perturb(self, predictor, x, y, eps, call):
        return 1 / 0


def test_a_crashing_attack_is_named_and_its_traceback_stored(tmp_path, monkeypatch, capsys):
    """The run ends as on any crash (units before it kept, --resume recomputes it), and the
    command line names the plugin instead of printing a traceback."""
    module = types.ModuleType("crashing")
    module.aisafety_attacks = hookimpl(lambda: [Crashing])
    registry = build_registry(extra_plugins=[("crashing", module)])
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    monkeypatch.setattr("aisafety.runner.default_registry", lambda: registry)
    path = tmp_path / "c.db"
    plan = tmp_path / "p.yaml"
    plan.write_text(
        "dataset: {limit: 24}\nattacks: [{name: fgsm, eps: [0.1]}, {name: crashing, eps: [0.1]}]"
        "\nmetrics: [ca, aaw]\ndevice: cpu\n"
    )
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{path}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "error: attack 'crashing' at eps=0.1 raised ZeroDivisionError: division by zero" in err
    assert "Traceback" not in err
    # the query it suggests reads this run's database (session 21: it read ./aisafety.db)
    assert f'aisafety query "SELECT error FROM unit_failures" --db sqlite:///{path}' in err
    ((error,),) = _rows(path, "SELECT error FROM unit_failures")
    assert "Traceback" in error and "1 / 0" in error
    assert {attack for (attack,) in _rows(path, "SELECT attack FROM results")} == {None, "fgsm"}
    assert _rows(path, "SELECT status FROM runs") == [("failed",)]


class _ZeroingDefense(InputDefense):
    """An input defense plugin that zeroes the images it is given, in place."""

    name = "zeroing"

    def transform(self, x):
        x.mul_(0)
        return x


def test_a_defense_plugin_writing_into_its_input_is_named_and_nothing_stored(tmp_path):
    """Finding 6: it used to end in a traceback (or stored CA on zeroed images); the
    defended model is named (``model+defense``) before any value is stored."""
    module = types.ModuleType("zeroing")
    module.aisafety_defenses = hookimpl(lambda: [_ZeroingDefense])
    registry = build_registry(extra_plugins=[("zeroing", module)])
    plan = EvaluationPlan.model_validate(
        {"dataset": {"limit": 8}, "metrics": ["ca"], "defenses": ["zeroing"], "device": "cpu"}
    )
    path = tmp_path / "r.db"
    runner = Runner(plan, ResultStore(f"sqlite:///{path}"), registry=registry, quiet=True)
    with pytest.raises(TamperingError, match=r"model 'mnist-cnn\+zeroing' wrote into its input"):
        runner.run()
    assert not _rows(path, "SELECT 1 FROM metric_values")
    assert _rows(path, "SELECT status FROM runs") == [("failed",)]
