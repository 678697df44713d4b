"""PGD adversarial training (Madry et al., 2018): fit the worst case inside the eps-ball.

Shared by the training defenses in ``aisafety.defense.training``. The inner maximisation is
l-inf PGD with a random start; the budget ramps up linearly over ``warmup_epochs`` (a common
stabiliser for small networks, e.g. Gowal et al. 2018), then stays at ``eps``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.attack.threat import LinfThreat
from aisafety.config_base import PluginConfig


class PGDTrainingConfig(PluginConfig):
    eps: float = Field(default=0.3, ge=0)
    steps: int = Field(default=10, gt=0)
    step_size: float = Field(default=0.05, gt=0)
    warmup_epochs: float = Field(default=1.0, ge=0)


def pgd_examples(
    network: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Adversarial inputs for training: PGD on the cross-entropy from a random start."""
    x_start = LinfThreat().random_start(x, eps, generator)

    def objective(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y, reduction="sum")

    return ascend_linf(network, objective, x, x_start, eps, steps, step_size)


def ascend_linf(
    network: nn.Module,
    objective: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    x_start: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
) -> torch.Tensor:
    """The inner maximisation every adversarial training shares: ``steps`` signed-gradient
    steps from ``x_start`` that raise ``objective(network(x_adv))`` (a scalar) inside the
    l-inf eps-ball around ``x`` and [0, 1]. The network runs in eval mode (batch-norm
    statistics untouched) and gradients flow to the input only, not to the parameters."""
    was_training = network.training
    network.eval()
    threat = LinfThreat()
    lower, upper = threat.bounds(x, eps)
    x_adv = x_start
    for _ in range(steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(objective(network(x_adv)), x_adv)
        x_adv = x_adv.detach() + step_size * threat.ascent(grad)
        x_adv = torch.clamp(x_adv, lower, upper)
    network.train(was_training)
    return x_adv.detach()


def linear_warmup(eps: float, warmup_epochs: float, progress_epochs: float) -> float:
    """eps after ``progress_epochs`` epochs when it ramps from 0 over ``warmup_epochs``."""
    if warmup_epochs <= 0:
        return eps
    return eps * min(1.0, progress_epochs / warmup_epochs)


def budget_at(config: PGDTrainingConfig, progress_epochs: float) -> float:
    """eps after ``progress_epochs`` epochs of training (linear warm-up)."""
    return linear_warmup(config.eps, config.warmup_epochs, progress_epochs)
