"""The Metric base class: declares what it needs, computes from the context."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from aisafety.config_base import PluginConfig, build_config
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import AttackFamily, AttackSpec, Capability, Direction, MetricValue


class Metric(ABC):
    """One robustness number. ``per_attack`` metrics are computed once per (attack, budget).

    ``attack_families`` restricts which attacks a per-attack metric applies to (AAW only
    makes sense for white-box attacks); ``None`` means every adversarial attack.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    direction: ClassVar[Direction]
    unit: ClassVar[str] = ""
    category: ClassVar[str] = "behaviour"
    per_attack: ClassVar[bool] = False
    attack_families: ClassVar[frozenset[AttackFamily] | None] = None
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

    def applies_to(self, family: AttackFamily) -> bool:
        if family is AttackFamily.CORRUPTION:
            return False
        return self.attack_families is None or family in self.attack_families

    def label(self) -> str:
        """Name plus non-default settings, e.g. ``ald(p=2)``: two configs, two rows."""
        extra = self.config.model_dump(exclude_defaults=True)
        return (
            f"{self.name}({','.join(f'{k}={v}' for k, v in extra.items())})" if extra else self.name
        )

    @abstractmethod
    def compute(
        self, ctx: EvaluationContext, attack: AttackSpec | None = None, eps: float | None = None
    ) -> MetricValue:
        """The value on ``ctx``; per-attack metrics get the attack spec and the budget."""

    def value(
        self,
        value: float,
        n_samples: int,
        attack: AttackSpec | None = None,
        eps: float | None = None,
        **details: Any,
    ) -> MetricValue:
        """Wrap a number with the metric's metadata."""
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
        )
