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
from pydantic import Field
from tqdm import tqdm

from aisafety.attack.projection import project
from aisafety.attack.result import AttackResult
from aisafety.config_base import PluginConfig, build_config
from aisafety.errors import InputError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

# On CPU, chunks of 128 were the fastest or within 10 % of it in bench/attacks.py on 2 cores
# (up to 1.2x per image over a batch of 512); on a GPU the whole batch is fastest.
CPU_CHUNK = 128


class AttackConfig(PluginConfig):
    seed: int = 0
    chunk_size: int | None = Field(
        default=None,
        gt=0,
        description="split larger batches into chunks of this size; "
        f"default {CPU_CHUNK} on CPU (1024 for Square), the whole batch on GPU",
    )


class Attack(ABC):
    """An adversarial attack; ``attack(predictor, x, y, eps)`` returns an ``AttackResult``."""

    name: ClassVar[str]
    family: ClassVar[AttackFamily]
    norm: ClassVar[Norm | None]
    requires: ClassVar[Capability]
    description: ClassVar[str] = ""
    Config: ClassVar[type[AttackConfig]] = AttackConfig
    # default chunk on CPU; query attacks whose samples drop out as they succeed (Square) set
    # a larger one: each chunk runs its own long tail of tiny batches for its hardest samples
    cpu_chunk: ClassVar[int] = CPU_CHUNK

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
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        chunk_size: int | None = None,
        progress: bool = False,
        clean_logits: torch.Tensor | None = None,
    ) -> AttackResult:
        """Attack ``x`` at budget ``eps``, in chunks; one random stream runs across chunks,
        so a sample's result does not depend on how the batch was split.

        ``clean_logits``: the model's logits on ``x`` where the caller has them already (an
        evaluation computes them once for every attack and budget); without them each call
        spends one forward pass on the clean batch.
        """
        predictor.require(self.requires, f"attack {self.name!r}")
        self._check(predictor, x, y, eps)
        self._check_clean_logits(predictor, x, clean_logits)
        size = chunk_size or self.config.chunk_size
        if size is None:
            size = self.cpu_chunk if predictor.device.type == "cpu" else len(x)
        self._generators: dict[str, torch.Generator] = {}
        try:
            given = clean_logits.split(size) if clean_logits is not None else [None] * len(x)
            chunks = list(zip(x.split(size), y.split(size), given, strict=False))
            parts = [
                self._attack_chunk(predictor, xc, yc, eps, lc)
                for xc, yc, lc in tqdm(
                    chunks, desc=f"{self.name} eps={eps:g}", disable=not progress
                )
            ]
        finally:
            self._generators = {}
        return parts[0] if len(parts) == 1 else AttackResult.concat(parts)

    def _attack_chunk(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        clean_logits: torch.Tensor | None = None,
    ) -> AttackResult:
        x, y = x.to(predictor.device), y.to(predictor.device, torch.long)
        started = time.perf_counter()
        candidate, steps = self.perturb(predictor, x, y, eps)
        x_adv = project(candidate.detach(), x, eps, self.norm)
        with torch.inference_mode():
            clean_logits = (
                predictor.logits(x) if clean_logits is None else clean_logits.to(x.device)
            )
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

    def _check_clean_logits(
        self, predictor: Predictor, x: torch.Tensor, clean_logits: torch.Tensor | None
    ) -> None:
        expected = (x.shape[0], predictor.num_classes)
        if clean_logits is not None and tuple(clean_logits.shape) != expected:
            raise InputError(
                f"attack {self.name!r}: clean_logits must have shape {expected} (one row of "
                f"logits per input), got {tuple(clean_logits.shape)}; or leave them out"
            )

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
        """The call's random stream, seeded with ``config.seed``: the same config and seed
        give the same result, and chunks of one call draw consecutive numbers."""
        key = str(device)
        active = getattr(self, "_generators", None)
        if active is None:
            return torch.Generator(device=device).manual_seed(self.config.seed)
        if key not in active:
            active[key] = torch.Generator(device=device).manual_seed(self.config.seed)
        return active[key]
