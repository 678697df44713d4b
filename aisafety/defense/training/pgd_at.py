"""PGD adversarial training (Madry et al., 2018): fit the worst case inside the eps-ball."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aisafety.database.datasets.base import LoadedDataset
from aisafety.defense.adversarial_training import (
    PGDTrainingConfig,
    budget_at,
    pgd_examples,
    step_at,
)
from aisafety.defense.training.base import TrainingDefense, TrainingStep, batched_mean


class PGDAdversarialTraining(TrainingDefense):
    """Cross-entropy on l-inf PGD examples (random start by default), budget warmed up
    linearly or per epoch (``PGDTrainingConfig``)."""

    name = "pgd-at"
    description = "PGD adversarial training (Madry et al. 2018), l-inf, random start by default"
    Config = PGDTrainingConfig
    selection_metric = "PGD robust accuracy"

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        eps = budget_at(c, step.progress)
        x_adv = pgd_examples(
            network, x, y, eps, c.steps, step_at(c, eps), step.generator, c.random_start
        )
        return F.cross_entropy(network(x_adv), y)

    def selection_score(self, network: nn.Module, data: LoadedDataset, epoch: int) -> float:
        """Accuracy under PGD at the full eps (``select_steps`` of ``select_relative_step``
        * eps, random start, seed 0 every epoch): the SoK's per-epoch test attack."""
        c = self.config
        generator = torch.Generator().manual_seed(0)

        def survives(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            step = c.select_relative_step * c.eps
            x_adv = pgd_examples(network, x, y, c.eps, c.select_steps, step, generator)
            with torch.no_grad():
                return network(x_adv).argmax(1) == y

        return batched_mean(data, survives)
