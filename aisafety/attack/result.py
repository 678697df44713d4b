"""What an attack hands back: the adversarial batch and per-sample outcomes."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from aisafety.interfaces import Norm


def perturbation_norms(delta: torch.Tensor) -> dict[str, torch.Tensor]:
    """l0 / l1 / l2 / linf size of each sample's perturbation (l0 counts changed values)."""
    flat = delta.flatten(1)
    return {
        "l0": (flat != 0).sum(1).float(),
        "l1": flat.abs().sum(1),
        "l2": flat.norm(p=2, dim=1),
        "linf": flat.abs().amax(1) if flat.shape[1] else flat.new_zeros(flat.shape[0]),
    }


@dataclass
class AttackResult:
    """One attack at one budget on one batch; every tensor has the batch as first dim."""

    attack: str
    eps: float
    norm: Norm | None
    x: torch.Tensor
    x_adv: torch.Tensor
    y: torch.Tensor
    clean_logits: torch.Tensor
    adv_logits: torch.Tensor
    success: torch.Tensor
    steps: torch.Tensor
    seconds: float
    # the class each sample was pushed towards (targeted calls); success stays misclassification
    target: torch.Tensor | None = None
    # an ensemble's members in order, and per sample which of them broke it (index into
    # ``members``, -1: none), which ran on it, and their steps; each member's seconds
    members: tuple[str, ...] | None = None
    broken_by: torch.Tensor | None = None
    member_attacked: torch.Tensor | None = None
    member_steps: torch.Tensor | None = None
    member_seconds: tuple[float, ...] | None = None

    @property
    def clean_pred(self) -> torch.Tensor:
        return self.clean_logits.argmax(1)

    @property
    def adv_pred(self) -> torch.Tensor:
        return self.adv_logits.argmax(1)

    @property
    def hit_target(self) -> torch.Tensor:
        """Per sample, whether the adversarial input is classified as its target class."""
        if self.target is None:
            raise ValueError(f"attack {self.attack!r} ran untargeted: it has no targets")
        return self.adv_pred == self.target

    @property
    def breakers(self) -> list[str | None]:
        """Per sample, the name of the ensemble member that broke it (None: none did)."""
        if self.members is None or self.broken_by is None:
            return [None] * len(self.y)
        return [self.members[i] if i >= 0 else None for i in self.broken_by.tolist()]

    @property
    def norms(self) -> dict[str, torch.Tensor]:
        return perturbation_norms(self.x_adv - self.x)

    @property
    def success_rate(self) -> float:
        return float(self.success.double().mean()) if len(self.y) else 0.0

    @property
    def robust_accuracy(self) -> float:
        return float((self.adv_pred == self.y).double().mean()) if len(self.y) else 0.0

    @classmethod
    def concat(cls, parts: list[AttackResult]) -> AttackResult:
        """Join the results of consecutive chunks of one batch."""
        first = parts[0]
        merged = {}
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if values[0] is None:
                merged[f.name] = None
            elif isinstance(values[0], torch.Tensor):
                merged[f.name] = torch.cat(values)
            elif f.name == "seconds":
                merged[f.name] = sum(values)
            elif f.name == "member_seconds":
                merged[f.name] = tuple(map(sum, zip(*values, strict=True)))
            else:
                merged[f.name] = getattr(first, f.name)
        return cls(**merged)
