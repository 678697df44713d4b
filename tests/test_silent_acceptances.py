"""What a plan used to accept silently, or answer unclearly, is refused naming the field,
the value and the fix (issue #35, findings 7 and 9)."""

from __future__ import annotations

import math
import sqlite3
import types
import warnings

import pytest
import torch
from torch import nn

from aisafety.cli import main
from aisafety.config import plan_from_dict
from aisafety.errors import ConfigError, PluginError
from aisafety.evaluation.base import CleanMetric
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import Direction
from aisafety.plugins import build_registry, default_registry
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


@pytest.mark.parametrize(
    "config, message",
    [({"steps": "3"}, "steps must be an integer, not the string '3' (write it unquoted)"),
     ({"steps": True}, "steps must be an integer, not true"),
     ({"step_size": float("nan")}, "step_size must be a number, not NaN"),
     ({"step_size": "0.01"}, "step_size must be a number, not the string '0.01'"),
     ({"seed": -1}, "seed: Input should be greater than or equal to 0")],
)  # fmt: skip
def test_attack_settings_are_not_coerced(config, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        default_registry().create("attack", "pgd-linf", config)


def test_honest_settings_still_pass():
    attack = default_registry().create("attack", "pgd-linf", {"steps": 3, "step_size": 0.01})
    assert attack.config.steps == 3 and attack.config.step_size == 0.01
    assert default_registry().create("attack", "pgd-linf", {"step_size": 1}).config.step_size == 1


def _plan(**fields):
    return plan_from_dict({"device": "cpu", **fields}, "plan")


@pytest.mark.parametrize(
    "fields, message",
    [({"seed": 3, "seeds": [0, 1]}, "gives both seed (3) and seeds ([0, 1])"),
     ({"metrics": ["ca", "ca"]}, "metric 'ca' is listed twice with the same settings"),
     ({"attacks": [{"name": "fgsm"}, {"name": "fgsm"}]}, "attack 'fgsm' is listed twice"),
     ({"attacks": ["fgsm "]}, "name 'fgsm ' has spaces around it"),
     ({"metrics": [" ca"]}, "name ' ca' has spaces around it")],
)  # fmt: skip
def test_plan_mistakes_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):  # fmt: skip
        _plan(**fields)


def test_variants_of_one_metric_are_not_duplicates():
    _plan(metrics=[{"name": "ald", "config": {"norm": "l2"}}, {"name": "ald"}])


def test_a_budget_just_above_one_is_shown_with_its_digits():
    plan = _plan(attacks=[{"name": "fgsm", "eps": [1.0000001]}], metrics=["robust-accuracy"],
                 dataset={"limit": 4})  # fmt: skip
    with pytest.raises(ConfigError, match=r"budget eps=1.0000001 exceeds 1, the largest linf"):
        Runner(plan, store=None).prepare()


def test_a_plan_mistake_exits_2_without_a_traceback(tmp_path, capsys):
    plan = tmp_path / "p.yaml"
    plan.write_text("attacks: [{name: pgd-linf, config: {steps: '3'}}]\nmetrics: [aaw]\n")
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    err = capsys.readouterr().err
    assert "steps must be an integer, not the string '3'" in err and "Traceback" not in err


def test_a_nan_setting_in_a_plan_file_is_refused_not_stored_as_none(tmp_path, capsys):
    """The plan's JSON copy turned NaN into null, the default: caught on the spec itself."""
    plan = tmp_path / "p.yaml"
    plan.write_text("attacks: [{name: pgd-linf, config: {step_size: .nan}}]\nmetrics: [aaw]\n")
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    assert "config step_size: NaN is not a setting" in capsys.readouterr().err


def test_coverage_without_attacks_is_refused_not_an_empty_table(tmp_path, capsys):
    """Coverage reads the attacks' adversarial examples by default: listed in a plan without
    attacks (whatever its profile dataset) it gave no value, and the run ended with exit 0
    and an empty table."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "dataset: {name: mnist-embedded, limit: 8}\n"
        f"profile_dataset: {{name: npz, path: {tmp_path / 'missing.npz'}}}\n"
        "metrics: [kmncov, nbcov]\ndevice: cpu\n"
    )
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    err = capsys.readouterr().err
    assert "metric(s) 'kmncov', 'nbcov' read the adversarial examples" in err
    assert "config: {data: clean}" in err and "Traceback" not in err


def test_an_attack_metric_beside_clean_ones_without_attacks_is_named_in_a_warning():
    from aisafety.errors import AISafetyWarning

    with pytest.warns(AISafetyWarning, match="metric 'robust-accuracy' reads attacks' adv"):
        Runner(_plan(metrics=["ca", "robust-accuracy"], dataset={"limit": 4}), store=None)


@pytest.mark.parametrize("data", ["clean", "adversarial"])
def test_coverage_with_a_missing_profile_dataset_exits_2_naming_it(data, tmp_path, capsys):
    """Neuron bounds come from the profile data: missing, the unit fails naming its path
    and no coverage value is stored (the run is marked failed)."""
    missing = tmp_path / "missing.npz"
    adversarial = data == "adversarial"
    attacks = "attacks: [{name: fgsm, eps: [0.1]}]\n" if adversarial else ""
    other = "robust-accuracy" if adversarial else "ca"
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"dataset: {{name: mnist-embedded, limit: 8}}\n{attacks}"
        f"profile_dataset: {{name: npz, path: {missing}}}\n"
        f"metrics: [{{name: kmncov, config: {{data: {data}}}}}, {other}]\ndevice: cpu\n"
    )
    db = tmp_path / "r.db"
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert f"the neuron bounds: dataset 'npz': path '{missing}' does not exist" in err
    assert "; set the plan's 'profile_dataset'" in err
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT status FROM runs").fetchall() == [("failed",)]
        rows = connection.execute("SELECT 1 FROM metric_values WHERE metric LIKE 'kmncov%'")
        assert rows.fetchall() == []


class _Infinite(CleanMetric):
    name = "infinite"
    direction = Direction.HIGHER
    description = "a metric with a bug: +inf"

    def compute(self, ctx):
        return [self.value(math.inf, len(ctx.y))]


class _NegativeCount(CleanMetric):
    name = "negative-count"
    direction = Direction.HIGHER
    description = "a metric with a bug: n = -5"

    def compute(self, ctx):
        return [self.value(0.5, -5)]


@pytest.mark.parametrize(
    "metric, message",
    [("infinite", "metric 'infinite' (.*_Infinite) returned infinite = inf; a value must be "
                  "finite, or NaN where it is undefined; nothing of this unit is stored"),
     ("negative-count", "metric 'negative-count' (.*) returned negative-count with n_samples = "
                        "-5; a count of samples cannot be negative")],
)  # fmt: skip
def test_a_metric_returning_inf_or_a_negative_count_is_refused_and_nothing_stored(
    metric, message, tmp_path
):
    module = types.ModuleType("buggy")
    module.aisafety_metrics = hookimpl(lambda: [_Infinite, _NegativeCount])
    registry = build_registry(extra_plugins=[("buggy", module)])
    db = tmp_path / "r.db"
    plan = _plan(metrics=["ca", metric], dataset={"limit": 8})
    runner = Runner(plan, ResultStore(f"sqlite:///{db}"), registry=registry, quiet=True)
    with pytest.raises(PluginError, match=message.replace("(.*", r"\(.*").replace(")", r"\)")):
        runner.run()
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT metric FROM metric_values").fetchall() == []
        assert connection.execute("SELECT status FROM runs").fetchall() == [("failed",)]


class _CallCounter(nn.Module):
    """Logits = a fixed linear map + the number of forward calls so far: the second pass of
    a batch differs from the first by exactly 1 in every logit (the hand-computed reference).
    Counted in a Python attribute, not a buffer, so the run's weight fingerprints do not
    see it as a model that changes its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(784, 10)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x.flatten(1)) + self.calls


def _run_with(module: nn.Module, tmp_path, name: str) -> list[str]:
    from aisafety.prediction.torch_module import TorchPredictor

    predictor = TorchPredictor(module, (1, 28, 28), 10, name=name)
    plan = _plan(metrics=["ca"], dataset={"limit": 8}, batch_size=8)
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Runner(plan, store, quiet=True, model=(predictor, name)).run()
    return [str(w.message) for w in caught if "is not deterministic" in str(w.message)]


def test_a_model_whose_two_forward_passes_differ_is_named_with_the_difference(tmp_path):
    (message,) = _run_with(_CallCounter(), tmp_path, "call-counter")
    assert message.startswith(
        "model 'call-counter' is not deterministic: two forward passes of the same batch "
        "differ by up to 1 in the logits"
    )


def test_a_deterministic_model_gets_no_such_warning(tmp_path):
    torch.manual_seed(0)
    assert _run_with(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), tmp_path, "plain") == []


def test_a_random_input_defense_is_random_by_design_and_not_warned_about(tmp_path):
    """resize-pad draws another resize and offset on every call (its two passes differ),
    but its randomness is declared (a seeded stream): no warning, and no second pass that
    would draw from its stream and change the run's later draws."""
    from aisafety.evaluation.repeatable import repeat_difference

    plan = _plan(metrics=["ca"], dataset={"limit": 8}, defenses=[{"name": "resize-pad"}])
    assert repeat_difference(Runner(plan, store=None).prepare().context) > 0.1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Runner(plan, ResultStore(f"sqlite:///{tmp_path / 'r.db'}"), quiet=True).run()
    assert not [w for w in caught if "is not deterministic" in str(w.message)]


def test_a_fraction_in_yaml_is_answered_with_its_value():
    """YAML has no arithmetic: ``eps: [8/255]`` is the string '8/255', quoted or not, so the
    old fix "write it unquoted" did not work; the error gives the value to write."""
    import yaml

    text = "attacks: [{name: pgd-linf, eps: [8/255]}]\nmetrics: [robust-accuracy]\n"
    with pytest.raises(ConfigError, match=r"not the string '8/255' \(YAML does not divide: "
                       r"write its value, 0\.03137254901960784\)"):  # fmt: skip
        plan_from_dict(yaml.safe_load(text), "plan")
    config = yaml.safe_load("{eps: 1/255, verifier: crown}")
    with pytest.raises(ConfigError, match=r"write its value, 0\.00392156862745098\)"):
        default_registry().create("metric", "certified-accuracy", config)
    with pytest.raises(ConfigError, match=r"not the string 'x/0' \(write a number\)"):
        default_registry().create("metric", "certified-accuracy", {"eps": "x/0"})
