"""Input defenses: a predictor that transforms its input before the wrapped model sees it.

Adaptive evaluation (Athalye, Carlini & Wagner 2018) is a property of the defended
predictor, switched on in its config, so every gradient attack becomes adaptive without
being touched:

- ``bpda: true`` (Backward Pass Differentiable Approximation): the forward pass runs the real
  ``transform``; the backward pass runs through ``surrogate`` (identity unless a defense has
  a closer differentiable approximation).
- ``eot_samples: k`` (Expectation over Transformation): an attacker's logits are the mean of
  ``k`` draws of a random defense, so its gradient is the mean gradient over the draws.

Both act only on an *attacker pass* (gradients enabled and the input requires them). A
prediction, such as the one that decides whether an attack succeeded, is always one plain
pass through the real defense: switching adaptivity on changes what an attacker learns,
never what the defended model answers.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, Field, create_model

from aisafety import randomness
from aisafety.config_base import PluginConfig, build_config
from aisafety.interfaces import Capability
from aisafety.prediction.base import Predictor

TRANSFORM_COPIES = 8.0  # a pointwise transform's input, output, gradients and temporaries


class InputDefenseConfig(PluginConfig):
    bpda: bool = Field(
        default=False,
        description="attackers' gradients pass through the defense's differentiable "
        "surrogate instead of the real transform (BPDA, Athalye et al. 2018)",
    )
    eot_samples: int = Field(
        default=1,
        ge=1,
        description="attackers' logits average this many random draws of the defense "
        "(EOT, Athalye et al. 2018); useful for random defenses only",
    )


class RandomDefenseConfig(InputDefenseConfig):
    seed: int = Field(default=0, description="seeds the defense's own random stream")


class InputDefense(Predictor):
    """Wraps any predictor; capabilities are the wrapped model's.

    Without ``bpda``, gradients flow through ``transform`` exactly as PyTorch computes them:
    for a non-differentiable transform (rounding, JPEG) that is the obfuscated gradient a
    non-adaptive attacker sees, which is the point of evaluating it.
    """

    name: ClassVar[str]  # type: ignore[misc]
    description: ClassVar[str] = ""
    Config: ClassVar[type[PluginConfig]] = InputDefenseConfig
    # A differentiable transform is its own best surrogate: BPDA then keeps its gradient.
    differentiable: ClassVar[bool] = False

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
        seed = getattr(self.config, "seed", 0)
        self.generator = randomness.generator(seed)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        config = cls.__dict__.get("Config")
        if (
            isinstance(config, type)
            and issubclass(config, BaseModel)
            and not issubclass(config, InputDefenseConfig)
        ):
            cls.Config = with_adaptive_settings(config)

    @classmethod
    def describe(cls) -> dict[str, Any]:
        defaults = {key: field.default for key, field in cls.Config.model_fields.items()}
        return {
            "name": cls.name,
            "kind": "input",
            "description": cls.description,
            "config": defaults,
        }

    @abstractmethod
    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """The defended view of ``x`` (same shape, values in [0, 1])."""

    def transform_copies(self) -> float:
        """Input-sized float32 copies one image's transform holds at its peak, forward and
        backward, with a margin: the memory budget's estimate (``prediction/footprint.py``;
        measured per defense in ``tests/test_defense_memory.py``)."""
        return TRANSFORM_COPIES

    def passes(self, grad: bool) -> int:
        """Passes of the wrapped model per input: an attacker's pass (``grad``) averages
        ``eot_samples`` draws, each a pass of its own."""
        return getattr(self.config, "eot_samples", 1) if grad else 1

    def surrogate(self, x: torch.Tensor) -> torch.Tensor:
        """A differentiable approximation of ``transform`` for BPDA; identity by default,
        Athalye et al.'s choice for transforms that keep the image close to the input."""
        return x

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if is_attacker_pass(x):
            return self._attacker_logits(x)
        return self.inner._logits(self.transform(x))

    def _attacker_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits an attacker differentiates: BPDA view, averaged over EOT draws."""
        samples = getattr(self.config, "eot_samples", 1)
        batch = x.repeat(samples, 1, 1, 1) if samples > 1 else x
        bpda = getattr(self.config, "bpda", False) and not self.differentiable
        logits = self.inner._logits(self._bpda_view(batch) if bpda else self.transform(batch))
        return logits.view(samples, len(x), -1).mean(0) if samples > 1 else logits

    def _bpda_view(self, x: torch.Tensor) -> torch.Tensor:
        """Value of ``transform(x)``, gradient of ``surrogate(x)``."""
        approximation = self.surrogate(x)
        return approximation + (self.transform(x) - approximation).detach()

    def layer_names(self) -> list[str]:
        return self.inner.layer_names()

    def features(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        self.require(Capability.ACTIVATIONS, "features()")
        return self.inner.features(self.transform(x), layers)


def with_adaptive_settings(config: type[BaseModel]) -> type[BaseModel]:
    """``config`` with ``bpda`` and ``eot_samples`` added. Every input defense takes them
    (docs/defenses.md), and the obfuscation warning tells users to set them, so a plugin
    whose ``Config`` derives from ``PluginConfig`` instead of ``InputDefenseConfig`` gets
    them too rather than refusing the adaptive evaluation."""
    return create_model(
        config.__name__,
        __base__=(config, InputDefenseConfig),
        __module__=config.__module__,
        __doc__=config.__doc__,
    )


def is_attacker_pass(x: torch.Tensor) -> bool:
    """True when someone is about to differentiate through this call."""
    return torch.is_grad_enabled() and x.requires_grad


def straight_through_round(x: torch.Tensor) -> torch.Tensor:
    """``round(x)`` forward, identity backward: the straight-through estimator."""
    return x + (torch.round(x) - x).detach()
