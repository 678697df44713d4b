"""Reading evaluation plans from YAML or TOML, and the embedded default plan."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from aisafety.config_base import describe_errors
from aisafety.errors import ConfigError
from aisafety.interfaces import AttackSpec, EvaluationPlan, MetricSpec

DEFAULT_METRICS = ("ca", "aaw", "acac", "actc", "nte", "ald", "ass")


def default_plan() -> EvaluationPlan:
    """The zoo MNIST CNN on the embedded 1,000-image subset, FGSM and PGD-40 at three budgets."""
    return EvaluationPlan(
        attacks=(
            AttackSpec(name="fgsm", eps=(0.1, 0.2, 0.3)),
            AttackSpec(name="pgd-linf", config={"steps": 40}, eps=(0.1, 0.2, 0.3)),
        ),
        metrics=tuple(MetricSpec(name=n) for n in DEFAULT_METRICS),
    )


def plan_from_dict(raw: dict[str, Any], source: str = "config") -> EvaluationPlan:
    try:
        return EvaluationPlan(**raw)
    except ValidationError as exc:
        problems = "\n".join(f"  - {line}" for line in describe_errors(exc))
        raise ConfigError(f"{source} is not a valid evaluation plan:\n{problems}") from None
    except TypeError as exc:
        raise ConfigError(f"{source} must be a mapping of plan fields: {exc}") from None


def load_plan(path: str | Path) -> EvaluationPlan:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml", ".json"):
            raw = yaml.safe_load(text)
        else:
            raise ConfigError(f"config {path.name!r}: use a .yaml, .yml, .toml or .json file")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config {str(path)!r} cannot be parsed: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {str(path)!r} must hold a mapping of plan fields at top level")
    return plan_from_dict(raw, f"config {str(path)!r}")
