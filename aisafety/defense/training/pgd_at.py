"""PGD adversarial training (Madry et al., 2018): fit the worst case inside the eps-ball."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aisafety.defense.adversarial_training import PGDTrainingConfig, budget_at, pgd_examples
from aisafety.defense.training.base import TrainingDefense, TrainingStep


class PGDAdversarialTraining(TrainingDefense):
    """Cross-entropy on l-inf PGD examples (random start), budget warmed up linearly."""

    name = "pgd-at"
    description = "PGD adversarial training (Madry et al. 2018), l-inf, random start"
    Config = PGDTrainingConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        eps = budget_at(c, step.progress)
        x_adv = pgd_examples(network, x, y, eps, c.steps, c.step_size, step.generator)
        return F.cross_entropy(network(x_adv), y)
