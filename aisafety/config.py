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
from aisafety.plan_yaml import load_yaml

DEFAULT_METRICS = ("ca", "aaw", "acac", "actc", "nte", "ald", "ass")


# The AutoAttack-style ensemble at a budget the embedded default can afford: 10 APGD/FAB
# iterations (torchattacks' AutoAttack default) and 500 Square queries cost 3.6x PGD-40 on the
# default job (docs/attacks.md, "The embedded default"); AutoAttack's own 100 and 5,000 are
# `standard`'s defaults in any plan.
DEFAULT_ENSEMBLE = {"steps": 10, "queries": 500}


def default_plan() -> EvaluationPlan:
    """The zoo MNIST CNN on the embedded 1,000-image subset: FGSM, PGD-40 and the ``standard``
    ensemble (reduced budget) at three budgets."""
    return EvaluationPlan(
        attacks=(
            AttackSpec(name="fgsm", eps=(0.1, 0.2, 0.3)),
            AttackSpec(name="pgd-linf", config={"steps": 40}, eps=(0.1, 0.2, 0.3)),
            AttackSpec(name="standard", config=DEFAULT_ENSEMBLE, eps=(0.1, 0.2, 0.3)),
        ),
        metrics=tuple(MetricSpec(name=n) for n in DEFAULT_METRICS),
    )


def plan_from_dict(raw: dict[str, Any], source: str = "config") -> EvaluationPlan:
    try:
        return EvaluationPlan.model_validate(raw)
    except ValidationError as exc:
        problems = "\n".join(f"  - {line}" for line in describe_errors(exc))
        raise ConfigError(f"{source} is not a valid evaluation plan:\n{problems}") from None
    except TypeError as exc:
        raise ConfigError(f"{source} must be a mapping of plan fields: {exc}") from None


MAX_PLAN_BYTES = 1 << 20  # a plan is a few KiB; this is not one


def load_plan(path: str | Path) -> EvaluationPlan:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(f"config {path.name!r}: use a .yaml, .yml, .toml or .json file")
    text = _read_text(path)
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else load_yaml(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config {str(path)!r} cannot be parsed: {exc}") from None
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. an int of 5,000 digits
        raise ConfigError(
            f"config {str(path)!r} holds a value that cannot be read: {exc}"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {str(path)!r} must hold a mapping of plan fields at top level")
    if not raw:
        raise ConfigError(
            f"config {str(path)!r} is empty; give at least 'attacks' or 'metrics' "
            "(see docs/configuration.md), or omit the file to run the embedded default plan"
        )
    return plan_from_dict(resolve_paths(raw, path.absolute().parent), f"config {str(path)!r}")


PATH_SECTIONS = ("model", "reference_model", "dataset", "profile_dataset")


def resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative ``path`` fields of a plan file are relative to the file's folder, as in
    other tools' config files: the plan runs the same from any working directory."""
    resolved = dict(raw)
    for section in PATH_SECTIONS:
        spec = raw.get(section)
        if isinstance(spec, dict) and isinstance(spec.get("path"), str) and spec["path"]:
            given = Path(spec["path"]).expanduser()
            resolved[section] = {
                **spec,
                "path": str(given if given.is_absolute() else base / given),
            }
        if isinstance(spec, dict) and spec.get("source") == "python":
            resolved[section] = {**resolved[section], "python_path": _code_folders(spec, base)}
    return resolved


def _code_folders(spec: dict[str, Any], base: Path) -> list[str]:
    """Where a ``python`` model's factory is imported from: the plan's folder first (as
    pytest finds a ``conftest.py``), then the spec's ``python_path``, relative to it."""
    given = spec.get("python_path") or []
    if not isinstance(given, list | tuple):
        return given  # the spec's validation names the wrong type
    folders = [Path(str(p)).expanduser() for p in given]
    return [str(base), *(str(p if p.is_absolute() else base / p) for p in folders)]


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; a clear error for a binary, huge or differently encoded file."""
    data = path.read_bytes()
    if len(data) > MAX_PLAN_BYTES:
        raise ConfigError(
            f"config {str(path)!r} is {len(data):,} bytes; a plan is a few KiB of text "
            f"(limit {MAX_PLAN_BYTES:,}): is this the right file?"
        )
    if b"\x00" in data:
        raise ConfigError(f"config {str(path)!r} is a binary file, not a YAML/TOML plan")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config {str(path)!r} is not UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}); save it as UTF-8"
        ) from None
