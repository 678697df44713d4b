"""The two kinds of metric: one number on the clean data, one number on an attack's result.

A ``CleanMetric`` is computed once per run, ``compute(ctx)``; an ``AttackMetric`` once per
(attack, budget), ``compute(ctx, attack, eps)``. Both read everything from the evaluation
context, which computes each shared artifact (clean logits, adversarial examples, neuron
outputs) once for all metrics.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from aisafety.config_base import PluginConfig, build_config
from aisafety.errors import PluginError
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import (
    AttackFamily,
    AttackSpec,
    Capability,
    Direction,
    MetricValue,
    SampleVerdict,
    SmoothingCertificates,
)


class Metric(ABC):
    """What both kinds share: metadata, configuration and the ``MetricValue`` wrapper.

    Subclass ``CleanMetric`` or ``AttackMetric``, never this class directly.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    direction: ClassVar[Direction]
    unit: ClassVar[str] = ""
    category: ClassVar[str] = "behaviour"
    per_attack: ClassVar[bool]  # set by the kind: False for CleanMetric, True for AttackMetric
    requires: ClassVar[Capability] = Capability.SCORES
    needs_reference: ClassVar[bool] = False  # compares with the plan's ``reference_model``
    Config: ClassVar[type[PluginConfig]] = PluginConfig

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        self.config = build_config(
            f"metric {self.name!r}", self.Config, {**(config or {}), **overrides}
        )

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "category": cls.category,
            "direction": cls.direction.value,
            "unit": cls.unit,
            "per_attack": cls.per_attack,
            "requires": cls.requires.value,
            "needs_reference": cls.needs_reference,
            "description": cls.description,
        }

    def check_model(self, predictor: Any) -> None:
        """Raise, when the plan is checked (before any work), if this metric cannot evaluate
        ``predictor``; beyond ``requires`` (e.g. a verifier that cannot bound one of its ops)."""
        return None  # most metrics evaluate any model meeting ``requires``

    def label(self) -> str:
        """Name plus non-default settings, e.g. ``ald(p=2)``: two configs, two rows. A
        plugin's settings (``verifier_config``) go with its name as attacks are labelled:
        ``verifier=crown(timeout=60)``, not the whole dict's repr (the plan keeps it)."""
        extra = self.config.model_dump(exclude_defaults=True)
        full = self.config.model_dump()
        for key in [k for k in extra if k.endswith("_config") and k[: -len("_config")] in full]:
            plugin = key[: -len("_config")]
            extra[plugin] = plugin_label(full[plugin], extra.pop(key))
        return (
            f"{self.name}({','.join(f'{k}={v}' for k, v in extra.items())})" if extra else self.name
        )

    def value(
        self,
        value: float,
        n_samples: int,
        attack: AttackSpec | None = None,
        eps: float | None = None,
        *,
        verdicts: Sequence[SampleVerdict] = (),
        smoothing_certificates: SmoothingCertificates | None = None,
        **details: Any,
    ) -> MetricValue:
        """Wrap a number with the metric's metadata (``eps`` may also be a clean metric's own
        radius, e.g. ENI's noise level); ``details`` are stored as JSON, the per-sample
        ``verdicts`` and ``smoothing_certificates`` as rows of their tables."""
        return MetricValue(
            metric=self.label(),
            value=float(value),
            direction=self.direction,
            unit=self.unit,
            attack=attack.label if attack else None,
            attack_key=attack.key() if attack else None,
            eps=eps,
            n_samples=n_samples,
            details=details,
            verdicts=tuple(verdicts),
            smoothing_certificates=smoothing_certificates,
        )


def plugin_label(name: str, config: dict[str, Any]) -> str:
    """``crown(clock=cpu,timeout=60)``: as ``AttackSpec.label`` writes an attack."""
    return f"{name}({','.join(f'{k}={v}' for k, v in sorted(config.items()))})"


class CleanMetric(Metric):
    """A number on the clean evaluated data (and, for some, the reference model or
    corrupted copies of the data): computed once per run."""

    per_attack = False
    # True for a metric that can run for hours on one model (a verifier): it is a resumable
    # unit of its own instead of sharing the one unit of the cheap clean metrics
    own_unit: ClassVar[bool] = False

    @abstractmethod
    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        """The values on ``ctx``: one for most metrics, one per layer for per-layer ones."""


class AttackMetric(Metric):
    """A number on one attack's result at one budget: computed once per (attack, eps).

    ``attack_families`` restricts which attacks it applies to (AAW only makes sense for
    white-box attacks); ``None`` means every attack.
    """

    per_attack = True
    attack_families: ClassVar[frozenset[AttackFamily] | None] = None

    def applies_to(self, family: AttackFamily) -> bool:
        return self.attack_families is None or family in self.attack_families

    @abstractmethod
    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        """The values on ``attack``'s adversarial examples at budget ``eps`` (one for most
        metrics, one per layer for per-layer ones)."""


def checked_values(metric: Metric, values: Any) -> list[MetricValue]:
    """What ``metric.compute`` returned, or a PluginError naming the metric and the fix:
    ``compute`` returns a list of ``MetricValue`` always."""
    if isinstance(values, list) and all(isinstance(v, MetricValue) for v in values):
        for value in values:
            _check_number(metric, value)
        return values
    got = type(values).__name__
    if isinstance(values, list):
        got = f"a list holding {', '.join(sorted({type(v).__name__ for v in values}))}"
    raise PluginError(
        f"metric {metric.name!r} ({type(metric).__module__}.{type(metric).__qualname__}): "
        f"compute returned {got}; it must return a list of MetricValue, e.g. "
        "[self.value(number, n_samples)]"
    )


def _check_number(metric: Metric, value: MetricValue) -> None:
    """An infinite value or a negative sample count is a bug in the metric, never a result:
    refused before anything of its unit is stored. NaN stays allowed: it is how a metric
    says "undefined here" (no sample to average over)."""
    who = f"metric {metric.name!r} ({type(metric).__module__}.{type(metric).__qualname__})"
    if math.isinf(value.value):
        raise PluginError(
            f"{who} returned {value.metric} = {value.value}; a value must be finite, or NaN "
            "where it is undefined; nothing of this unit is stored (fix the metric)"
        )
    if value.n_samples < 0:
        raise PluginError(
            f"{who} returned {value.metric} with n_samples = {value.n_samples}; a count of "
            "samples cannot be negative; nothing of this unit is stored (fix the metric)"
        )
