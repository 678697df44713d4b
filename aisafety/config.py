"""Reading evaluation plans from YAML or TOML, and the embedded default plan."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from aisafety.config_base import describe_errors
from aisafety.errors import ConfigError
from aisafety.files import regular_file
from aisafety.interfaces import AttackSpec, EvaluationPlan, MetricSpec
from aisafety.plan_yaml import load_yaml

DEFAULT_METRICS = ("ca", "aaw", "aab", "acac", "actc", "nte", "ald", "ass", "zero-gradient-rate")


# The default's ensemble, sized to be at least as strong as every single attack beside it at
# every budget within the default's 2 minutes of CPU (measured in README.md, "The default
# evaluation", and by bench/first_run.py): APGD-CE with PGD's 40 iterations (its step-size
# schedule makes it stronger than PGD-40 at 0.1: 0.622 against 0.645), APGD-T on the 3 most
# likely other classes with 10 iterations, Square with 100 queries. FAB-T (minimal
# perturbations, 9 targets) is left out: it broke nothing APGD had not at these budgets and
# cost most of the reduced ensemble's 103 s. examples/default-full.yaml is this plan with
# AutoAttack's own budget (all four members, 100 iterations, 5,000 queries).
DEFAULT_ENSEMBLE = {
    "attacks": ["apgd-ce", "apgd-t", "square-linf"],
    "steps": 40,
    "queries": 100,
    "attack_configs": {"apgd-t": {"n_target_classes": 3, "steps": 10}},
}


def default_plan() -> EvaluationPlan:
    """The zoo MNIST CNN on the embedded 1,000-image subset: the ensemble, PGD-40 and FGSM at
    three budgets, plus the cheap runs that let every gradient-masking sanity check of the
    report run (FGSM at 0.5, PGD-10 beside PGD-40, Square and random noise at 0.1, the
    zero-gradient rate)."""
    return EvaluationPlan(
        attacks=(
            AttackSpec(name="standard", config=DEFAULT_ENSEMBLE, eps=(0.1, 0.2, 0.3)),
            AttackSpec(name="pgd-linf", config={"steps": 40}, eps=(0.1, 0.2, 0.3)),
            AttackSpec(name="fgsm", eps=(0.1, 0.2, 0.3, 0.5)),
            AttackSpec(name="pgd-linf", config={"steps": 10}, eps=(0.1,)),
            AttackSpec(name="square-linf", config={"queries": 100}, eps=(0.1,)),
            AttackSpec(name="random-noise", eps=(0.1,)),
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
    path = regular_file(path, "config file", MAX_PLAN_BYTES)  # stat, before any read
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
    """Relative ``path`` (and ``model_dir``) fields of a plan file are relative to the
    file's folder, as in other tools' config files: the plan runs the same from any working
    directory."""
    resolved = dict(raw)
    for section in PATH_SECTIONS:
        spec = raw.get(section)
        for key in ("path", "model_dir"):  # model_dir: a robustbench model's folder
            if isinstance(spec, dict) and isinstance(spec.get(key), str) and spec[key]:
                given = Path(spec[key]).expanduser()
                resolved[section] = {
                    **resolved[section],
                    key: str(given if given.is_absolute() else base / given),
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


MODEL_FILES = {".onnx": "onnx", ".pt2": "export"}  # other suffixes (.pt) hold several kinds
FILE_SUFFIXES = {*MODEL_FILES, ".pt", ".pth", ".ts", ".ckpt", ".safetensors"}


def refuse_model_file(model: str) -> None:
    """``--model`` names a zoo model; a model file given there was answered with the list
    of 44 zoo names. Say where a file goes instead (docs/own-model.md)."""
    suffix = Path(model).suffix.lower()
    if suffix not in FILE_SUFFIXES and not Path(model).is_file():
        return  # a zoo (or plugin) model's name
    source = MODEL_FILES.get(suffix, "onnx, export, torchscript or python")
    raise ConfigError(
        f"--model {model!r} is a model file; --model takes the name of a zoo model (aisafety "
        f"list models). Name the file in the plan's model instead: model: {{source: {source}, "
        f"path: {model}}}, with its input settings (mean/std, scale, layout; docs/own-model.md)"
    )


def apply_overrides(
    plan: EvaluationPlan,
    device: str | None,
    limit: int | None,
    executor: str | None = None,
    address: str | None = None,
    model: str | None = None,
    dataset: str | None = None,
) -> EvaluationPlan:
    """The plan with command-line options applied, validated like the plan file itself.
    ``model``: a zoo model in place of the plan's model (one model of a shared plan);
    ``dataset``: a registered dataset in place of the plan's, keeping its split, limit, seed
    and sampling."""
    raw = plan.model_dump(mode="json", exclude_unset=True)
    if model is not None:
        refuse_model_file(model)
        raw["model"] = {"name": model}
    if dataset is not None:
        kept = ("split", "limit", "seed", "sampling")
        raw["dataset"] = {"name": dataset} | {
            k: v for k, v in raw.get("dataset", {}).items() if k in kept
        }
    if device is not None:
        raw["device"] = device
    if limit is not None:
        raw["dataset"] = {**raw.get("dataset", {}), "limit": limit}
    if executor is not None:
        raw["executor"] = {**raw.get("executor", {}), "name": executor}
    if address is not None:
        raw["executor"] = {**raw.get("executor", {}), "address": address}
    return plan_from_dict(
        raw,
        "the plan with the command-line options (--model, --dataset, --device, --limit, "
        "--executor, --address)",
    )
