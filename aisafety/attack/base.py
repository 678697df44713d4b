"""The Attack base class: configuration at construction, budgets at call time.

Subclasses implement ``perturb``. The base class checks the model's capabilities and the
inputs, projects whatever ``perturb`` returns back into the budget and the [0, 1] box, and
re-evaluates the model itself, so no attack can report a success that is over budget or
that the model does not confirm.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from aisafety.attack.projection import project
from aisafety.attack.result import AttackResult
from aisafety.config_base import PluginConfig, build_config
from aisafety.errors import InputError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class AttackConfig(PluginConfig):
    seed: int = 0


class Attack(ABC):
    """An adversarial attack; ``attack(predictor, x, y, eps)`` returns an ``AttackResult``."""

    name: ClassVar[str]
    family: ClassVar[AttackFamily]
    norm: ClassVar[Norm | None]
    requires: ClassVar[Capability]
    description: ClassVar[str] = ""
    Config: ClassVar[type[AttackConfig]] = AttackConfig

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        self.config = build_config(
            f"attack {self.name!r}", self.Config, {**(config or {}), **overrides}
        )

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "family": cls.family.value,
            "norm": cls.norm.value if cls.norm else None,
            "requires": cls.requires.value,
            "description": cls.description,
        }

    @abstractmethod
    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return candidate adversarial inputs and the steps (or queries) spent per sample."""

    def __call__(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> AttackResult:
        predictor.require(self.requires, f"attack {self.name!r}")
        self._check(predictor, x, y, eps)
        x, y = x.to(predictor.device), y.to(predictor.device, torch.long)
        started = time.perf_counter()
        candidate, steps = self.perturb(predictor, x, y, eps)
        x_adv = project(candidate.detach(), x, eps, self.norm)
        with torch.inference_mode():
            clean_logits = predictor.logits(x)
            adv_logits = predictor.logits(x_adv)
        return AttackResult(
            attack=self.name,
            eps=eps,
            norm=self.norm,
            x=x,
            x_adv=x_adv,
            y=y,
            clean_logits=clean_logits,
            adv_logits=adv_logits,
            success=adv_logits.argmax(1) != y,
            steps=steps.to(torch.long),
            seconds=time.perf_counter() - started,
        )

    def run_budgets(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, budgets: Sequence[float]
    ) -> list[AttackResult]:
        return [self(predictor, x, y, eps) for eps in budgets]

    def _check(self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float) -> None:
        predictor.check_input(x)
        if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
            raise InputError(
                f"attack {self.name!r}: labels must be integer class indices, got dtype "
                f"{y.dtype}; use y.long()"
            )
        if y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise InputError(
                f"attack {self.name!r}: labels must have shape ({x.shape[0]},), "
                f"got {tuple(y.shape)}"
            )
        if y.numel() and (y.min() < 0 or y.max() >= predictor.num_classes):
            raise InputError(
                f"attack {self.name!r}: labels must lie in 0..{predictor.num_classes - 1}, "
                f"got {int(y.min())}..{int(y.max())}"
            )
        if not eps >= 0:
            raise InputError(f"attack {self.name!r}: budget eps={eps} must be >= 0")

    def generator(self, device: torch.device) -> torch.Generator:
        """A fresh generator per call, so the same config and seed give the same result."""
        return torch.Generator(device=device).manual_seed(self.config.seed)
