"""Defensive distillation (Papernot et al., 2016).

A teacher is trained with its softmax at temperature T; the student (the shipped model)
is trained on the teacher's soft labels softmax(teacher(x) / T), also at temperature T, and
deployed at temperature 1. Its logits are then about T times larger, which saturates the
softmax: the defense works by flattening gradients and is known to fall to C&W-style
attacks (Carlini & Wagner 2017), which is why it belongs in the zoo.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.training.base import FitFunction, TrainingDefense, TrainingStep


class DistillationConfig(PluginConfig):
    temperature: float = Field(default=20.0, gt=0)


def soft_labels(teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return F.softmax(teacher_logits / temperature, dim=1)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against a probability vector, averaged over the batch."""
    return -(targets * F.log_softmax(logits, dim=1)).sum(1).mean()


class _TeacherStage(TrainingDefense):
    """Cross-entropy at temperature T: how Papernot et al. train the teacher."""

    name = "distillation-teacher"
    Config = DistillationConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        return F.cross_entropy(network(x) / self.config.temperature, y)


class DefensiveDistillation(TrainingDefense):
    name = "distillation"
    description = "defensive distillation (Papernot et al. 2016): student on teacher soft labels"
    Config = DistillationConfig

    teacher: nn.Module | None = None

    def prepare(self, network: nn.Module, fit: FitFunction) -> None:
        """Train the teacher (same architecture and recipe) before the student."""
        teacher = copy.deepcopy(network)
        for layer in teacher.modules():
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
        fit(teacher, _TeacherStage(self.config.model_dump()))
        self.teacher = teacher.eval().requires_grad_(False)

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        if self.teacher is None:
            raise RuntimeError("distillation: prepare() must train the teacher before loss()")
        t = self.config.temperature
        with torch.no_grad():
            targets = soft_labels(self.teacher(x), t)
        return soft_cross_entropy(network(x) / t, targets)
