"""PGD adversarial training (Madry et al., 2018): fit the worst case inside the eps-ball.

Shared by the training defenses in ``aisafety.defense.training``. The inner maximisation is
the attack's l-inf PGD (``aisafety.attack.pgd.linf_pgd``), from a random start by default;
the budget ramps up linearly over ``warmup_epochs`` (a common stabiliser for small networks,
e.g. Gowal et al. 2018), then stays at ``eps``. The SoK's VeriGauge code trains
differently, and these options reproduce it: PGD from the clean input (``random_start:
false``), a step relative to the current budget (``relative_step``: eps / 50 there) and a
budget constant within each epoch, eps * min((epoch + 1) / warmup_epochs, 1) (``warmup:
per-epoch``, 0-based epochs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.attack.pgd import linf_pgd
from aisafety.attack.threat import LinfThreat
from aisafety.config_base import PluginConfig
from aisafety.defense.mlp_gradient import ReluMlp


class PGDTrainingConfig(PluginConfig):
    eps: float = Field(default=0.3, ge=0)
    steps: int = Field(default=10, gt=0)
    step_size: float = Field(default=0.05, gt=0)
    relative_step: float | None = Field(
        default=None, gt=0, description="step as a fraction of the current eps (over step_size)"
    )
    random_start: bool = True
    warmup_epochs: float = Field(default=1.0, ge=0)
    warmup: Literal["linear", "per-epoch"] = Field(
        default="linear",
        description="linear: eps grows every batch; per-epoch: eps * min((epoch + 1) / "
        "warmup_epochs, 1), constant within an epoch (VeriGauge)",
    )
    # keep: best-test scores each epoch by PGD at eps: select_steps steps of
    # select_relative_step * eps from a random start (the SoK's test attack: 100 of eps / 50).
    select_steps: int = Field(default=100, gt=0)
    select_relative_step: float = Field(default=0.02, gt=0)


def pgd_examples(
    network: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    generator: torch.Generator,
    random_start: bool = True,
) -> torch.Tensor:
    """Adversarial inputs for training: PGD on the cross-entropy from a random start (or
    from ``x`` itself). A plain ReLU MLP gets its gradient by hand (``ReluMlp``: the same
    gradient, without autograd's per-op cost that dominates on the SoK's small FCNNs)."""
    x_start = LinfThreat().random_start(x, eps, generator) if random_start else x.clone()
    mlp = ReluMlp.of(network)
    if mlp is not None:
        gradient = partial(mlp.cross_entropy_gradient, y=y)
        return linf_pgd(gradient, x, x_start, eps, steps, step_size)

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

    def gradient(x_adv: torch.Tensor) -> torch.Tensor:
        x_adv = x_adv.detach().requires_grad_(True)
        return torch.autograd.grad(objective(network(x_adv)), x_adv)[0]

    x_adv = linf_pgd(gradient, x, x_start, eps, steps, step_size)
    network.train(was_training)
    return x_adv


def linear_warmup(eps: float, warmup_epochs: float, progress_epochs: float) -> float:
    """eps after ``progress_epochs`` epochs when it ramps from 0 over ``warmup_epochs``."""
    if warmup_epochs <= 0:
        return eps
    return eps * min(1.0, progress_epochs / warmup_epochs)


def budget_at(config: PGDTrainingConfig, progress_epochs: float) -> float:
    """eps after ``progress_epochs`` epochs of training (the config's warm-up)."""
    if config.warmup == "per-epoch" and config.warmup_epochs > 0:
        epoch = math.floor(progress_epochs)
        return config.eps * min(1.0, (epoch + 1) / config.warmup_epochs)
    return linear_warmup(config.eps, config.warmup_epochs, progress_epochs)


def step_at(config: PGDTrainingConfig, eps: float) -> float:
    """The PGD step at budget ``eps``: ``relative_step * eps`` if set, else ``step_size``."""
    return config.step_size if config.relative_step is None else config.relative_step * eps
