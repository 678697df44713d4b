"""TRADES (Zhang et al., 2019): clean cross-entropy plus beta times a robustness KL term.

loss = CE(f(x), y) + beta * KL(p(x) || p(x')) with x' the l-inf PGD maximiser of that KL,
started at x + 0.001 * N(0, 1) as in the authors' code. The KL is averaged over the batch
("batchmean"), so it is exactly 0 when x' = x.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.adversarial_training import ascend_linf, linear_warmup
from aisafety.defense.training.base import TrainingDefense, TrainingStep


class TradesConfig(PluginConfig):
    eps: float = Field(default=0.3, ge=0)
    steps: int = Field(default=10, gt=0)
    step_size: float = Field(default=0.05, gt=0)
    beta: float = Field(default=6.0, ge=0)
    warmup_epochs: float = Field(default=1.0, ge=0)


def robustness_kl(clean_logits: torch.Tensor, adv_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(clean) || softmax(adv)), summed over classes, averaged over the batch."""
    return F.kl_div(
        F.log_softmax(adv_logits, 1), F.log_softmax(clean_logits, 1),
        reduction="batchmean", log_target=True,
    )  # fmt: skip


def kl_examples(
    network: nn.Module,
    x: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
    generator: torch.Generator,
    center: torch.Tensor | None = None,
) -> torch.Tensor:
    """The inner maximisation of TRADES: PGD on the KL to the prediction at ``x``, inside
    the eps-ball around ``center`` (default ``x``; AH training passes the clean point for a
    frontier example that is itself a perturbation of it)."""
    was_training = network.training
    network.eval()
    with torch.no_grad():
        clean = network(x)
    network.train(was_training)
    noise = torch.randn(x.shape, generator=generator, device=x.device)
    x_start = (x + 0.001 * noise).clamp(0, 1)

    def objective(logits: torch.Tensor) -> torch.Tensor:
        return robustness_kl(clean, logits)

    ball = x if center is None else center
    return ascend_linf(network, objective, ball, x_start, eps, steps, step_size)


def trades_loss(
    network: nn.Module, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor, beta: float
) -> torch.Tensor:
    clean = network(x)
    return F.cross_entropy(clean, y) + beta * robustness_kl(clean, network(x_adv))


class Trades(TrainingDefense):
    name = "trades"
    description = "TRADES (Zhang et al. 2019): CE + beta * KL(clean || l-inf adversarial)"
    Config = TradesConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        eps = linear_warmup(c.eps, c.warmup_epochs, step.progress)
        x_adv = kl_examples(network, x, eps, c.steps, c.step_size, step.generator)
        return trades_loss(network, x, x_adv, y, c.beta)
