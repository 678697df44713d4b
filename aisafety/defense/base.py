"""Input defenses: a predictor that transforms its input before the wrapped model sees it."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from aisafety.config_base import PluginConfig, build_config
from aisafety.interfaces import Capability
from aisafety.prediction.base import Predictor


class InputDefense(Predictor):
    """Wraps any predictor; capabilities are the wrapped model's.

    Gradients flow through ``transform`` exactly as PyTorch computes them: for a
    non-differentiable transform (rounding, JPEG) that is the obfuscated gradient a
    non-adaptive attacker sees, which is the point of evaluating it.
    """

    name: ClassVar[str]  # type: ignore[misc]
    description: ClassVar[str] = ""
    Config: ClassVar[type[PluginConfig]] = PluginConfig

    def __init__(
        self, predictor: Predictor, config: dict[str, Any] | None = None, **overrides: Any
    ):
        self.config = build_config(
            f"defense {self.name!r}", self.Config, {**(config or {}), **overrides}
        )
        self.inner = predictor
        self.input_shape = predictor.input_shape
        self.num_classes = predictor.num_classes
        self.device = predictor.device
        self.capabilities = frozenset(predictor.capabilities)
        # The instance's name is the defended model's; the class keeps the registry name.
        self.name = f"{predictor.name}+{type(self).name}"

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {"name": cls.name, "kind": "input", "description": cls.description}

    @abstractmethod
    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """The defended view of ``x`` (same shape, values in [0, 1])."""

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner._logits(self.transform(x))

    def layer_names(self) -> list[str]:
        return self.inner.layer_names()

    def features(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        self.require(Capability.ACTIVATIONS, "features()")
        return self.inner.features(self.transform(x), layers)
