"""No defense: cross-entropy on clean inputs (the vanilla zoo models)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aisafety.defense.training.base import TrainingDefense, TrainingStep


class StandardTraining(TrainingDefense):
    name = "standard"
    description = "no defense: cross-entropy on clean training images (the baseline)"

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        return F.cross_entropy(network(x), y)
