"""The requirement file of ``aisafety check --require``: the gate's significance level and
minimum effect, and absolute requirements on the candidate run.

.. code-block:: yaml

    level: 0.05          # at most this often a re-run of the same model fails the gate
    min_effect: 0.01     # accuracy drops smaller than this never fail it
    requirements:
      - {kind: robust-accuracy, norm: linf, eps: 8/255, at_least: 0.45, confidence: 0.95}
      - {kind: no-sanity-warnings}
      - {kind: certified-accuracy, verifier: crown, eps: 1/255, at_least: 0.2}
"""

from __future__ import annotations

import tomllib
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidationError

from aisafety.errors import ConfigError
from aisafety.interfaces import StrictModel


def _budget(value: object) -> object:
    """``8/255`` as written in papers, or a number."""
    if isinstance(value, str) and "/" in value:
        try:
            return float(Fraction(value.replace(" ", "")))
        except (ValueError, ZeroDivisionError):
            message = f"{value!r} is neither a number nor a fraction such as 8/255"
            raise ValueError(message) from None
    return value


Budget = Annotated[float, BeforeValidator(_budget), Field(gt=0, le=1e6)]
Rate = Annotated[float, Field(ge=0, le=1)]
Confidence = Annotated[float, Field(gt=0, lt=1)]


class AccuracyRequirement(StrictModel):
    """A rate that must be at least ``at_least``, proved at ``confidence`` by the one-sided
    exact (Clopper-Pearson) lower bound over the run's samples."""

    at_least: Rate
    confidence: Confidence = 0.95
    name: str | None = None  # how the verdict is titled; default: said from the fields


class CleanAccuracy(AccuracyRequirement):
    kind: Literal["clean-accuracy"]

    def title(self) -> str:
        return self.name or f"clean accuracy >= {self.at_least:g}"


class RobustAccuracy(AccuracyRequirement):
    """Per sample the worst case over the run's attacks at (norm, eps), or ``attack``'s
    runs only (its name, or its label with settings)."""

    kind: Literal["robust-accuracy"]
    norm: Literal["l0", "l1", "l2", "linf"] = "linf"
    eps: Budget
    attack: str | None = None

    def title(self) -> str:
        under = f" under {self.attack}" if self.attack else ""
        return (
            self.name or f"robust accuracy{under} at {self.norm} {self.eps:g} >= {self.at_least:g}"
        )


class CertifiedAccuracy(AccuracyRequirement):
    """The certified-accuracy metrics (``certified-accuracy``, ``ibp-certified-accuracy``)
    of the run at ``eps``, from ``verifier`` when given."""

    kind: Literal["certified-accuracy"]
    eps: Budget
    verifier: str | None = None

    def title(self) -> str:
        by = f" with {self.verifier}" if self.verifier else ""
        return self.name or f"certified accuracy{by} at {self.eps:g} >= {self.at_least:g}"


class NoSanityWarnings(StrictModel):
    """No gradient-masking sanity check of the candidate warns (aisafety/sanity.py)."""

    kind: Literal["no-sanity-warnings"]
    name: str | None = None

    def title(self) -> str:
        return self.name or "no sanity check warns"


Requirement = Annotated[
    CleanAccuracy | RobustAccuracy | CertifiedAccuracy | NoSanityWarnings,
    Field(discriminator="kind"),
]


class GateSpec(StrictModel):
    """What the gate checks. ``level``: the chance that the same model, evaluated again,
    fails the comparison with the baseline (shared by all its tests); ``min_effect``: the
    accuracy drop a regression must exceed, with that confidence, to fail."""

    level: float = Field(default=0.05, gt=0, lt=0.5)
    min_effect: float = Field(default=0.0, ge=0, lt=1)
    regression: bool = True  # compare with the baseline (else: only the requirements)
    requirements: tuple[Requirement, ...] = ()


def load_gate_spec(path: str | Path) -> GateSpec:
    """Read a YAML/TOML requirement file; every mistake is a ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--require: requirement file {str(path)!r} does not exist")
    if path.suffix not in (".yaml", ".yml", ".toml"):
        raise ConfigError(f"--require {str(path)!r}: use a .yaml, .yml or .toml file")
    try:
        text = path.read_text(encoding="utf-8")
        raw = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--require {str(path)!r} cannot be read: {exc}") from None
    return gate_spec_from(raw or {}, f"--require {str(path)!r}")


def gate_spec_from(raw: object, source: str) -> GateSpec:
    try:
        return GateSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "\n".join(
            f"  - {'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(
            f"{source} is not a valid requirement file (docs/release-gate.md):\n{problems}"
        ) from None
