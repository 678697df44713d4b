"""What a plan used to accept silently, or answer unclearly, is refused naming the field,
the value and the fix (issue #35, findings 7 and 9)."""

from __future__ import annotations

import pytest

from aisafety.cli import main
from aisafety.config import plan_from_dict
from aisafety.errors import ConfigError
from aisafety.plugins import default_registry
from aisafety.runner import Runner


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
