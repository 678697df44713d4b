"""Bad plans fail early with messages that name the field and the fix."""

from __future__ import annotations

import pytest

from aisafety.config import default_plan, load_plan, plan_from_dict
from aisafety.errors import ConfigError, UnknownNameError
from aisafety.interfaces import AttackSpec, EvaluationPlan, ModelSpec
from aisafety.plugins import default_registry
from aisafety.runner import Runner


def test_default_plan_is_valid_and_names_registered_algorithms():
    plan = default_plan()
    registry = default_registry()
    assert {a.name for a in plan.attacks} <= set(registry.names("attack"))
    assert {m.name for m in plan.metrics} <= set(registry.names("metric"))


def test_negative_budget_is_rejected():
    with pytest.raises(ValueError, match="negative"):
        AttackSpec(name="fgsm", eps=-0.1)
    with pytest.raises(ValueError, match="negative"):
        AttackSpec(name="fgsm", eps=(0.1, -1.0))


def test_unknown_key_and_wrong_type_are_named():
    with pytest.raises(ConfigError) as err:
        plan_from_dict({"batch_size": "many", "atacks": []})
    message = str(err.value)
    assert "batch_size" in message and "atacks" in message


def test_unknown_attack_lists_the_known_ones(tmp_path):
    plan = EvaluationPlan(attacks=(AttackSpec(name="pgd-typo"),))
    with pytest.raises(UnknownNameError) as err:
        Runner(plan, store=None)  # fails while building, before any store access
    assert "pgd-typo" in str(err.value) and "pgd-linf" in str(err.value)


def test_bad_attack_config_names_the_setting():
    plan = EvaluationPlan(attacks=(AttackSpec(name="pgd-linf", config={"steps": -3}),))
    with pytest.raises(ConfigError, match="steps"):
        Runner(plan, store=None)


def test_checkpoint_model_needs_path_and_architecture():
    with pytest.raises(ValueError, match="architecture"):
        ModelSpec(name="mine", source="checkpoint")


def test_yaml_and_toml_configs_load(tmp_path):
    (tmp_path / "p.yaml").write_text(
        "attacks:\n  - name: fgsm\n    eps: [0.1, 0.2]\nmetrics: [ca, aaw]\n"
    )
    (tmp_path / "p.toml").write_text(
        'metrics = ["ca"]\n[[attacks]]\nname = "pgd-linf"\neps = 0.3\nconfig = {steps = 5}\n'
    )
    yaml_plan = load_plan(tmp_path / "p.yaml")
    assert yaml_plan.attacks[0].eps == (0.1, 0.2)
    assert [m.name for m in yaml_plan.metrics] == ["ca", "aaw"]
    toml_plan = load_plan(tmp_path / "p.toml")
    assert toml_plan.attacks[0].config == {"steps": 5} and toml_plan.attacks[0].eps == (0.3,)


def test_unreadable_config_files_give_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_plan(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("attacks: [\n")
    with pytest.raises(ConfigError, match="cannot be parsed"):
        load_plan(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_plan(tmp_path / "list.yaml")


def test_example_configs_are_valid():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"
    files = sorted(examples.glob("*.yaml")) + sorted(examples.glob("*.toml"))
    assert files, "examples/ must hold at least one config"
    for path in files:
        load_plan(path)
