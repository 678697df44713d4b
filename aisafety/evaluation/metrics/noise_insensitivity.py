"""epsilon-Empirical Noise Insensitivity (ENI), AISafety eq. 21 after Xu & Mannor (2012).

How much the loss moves per unit of l_inf input change under small random noise: an
empirical local Lipschitz constant of the loss. Lower is more insensitive (more robust).

Registered metrics: ``eni``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.inference import batched_logits
from aisafety.interfaces import Capability, Direction, MetricValue
from aisafety.prediction.base import Predictor


def loss_change_ratios(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    perturbed: torch.Tensor,
    batch_size: int,
) -> torch.Tensor:
    """|l(x_i | y_i) - l(mu_ij | y_i)| / ||x_i - mu_ij||_inf for clean x (n, ...) and perturbed
    mu (n, m, ...), with l the cross-entropy loss; shape (n, m). Pairs with mu = x are NaN."""
    n, m = perturbed.shape[:2]
    clean_loss = F.cross_entropy(
        batched_logits(predictor, x, batch_size).double(), y, reduction="none"
    )
    flat = perturbed.flatten(0, 1)
    noisy_loss = F.cross_entropy(
        batched_logits(predictor, flat, batch_size).double(),
        y.repeat_interleave(m),
        reduction="none",
    ).view(n, m)
    distance = (perturbed - x[:, None]).flatten(2).abs().amax(2).double()
    ratio = (noisy_loss - clean_loss[:, None]).abs() / distance
    return torch.where(distance > 0, ratio, torch.full_like(ratio, math.nan))


def polluted(
    x: torch.Tensor, m: int, eps: float, kind: str, generator: torch.Generator
) -> torch.Tensor:
    """m noisy copies (n, m, ...) of x within the l_inf ball of radius ``eps`` and [0, 1]:
    ``uniform`` draws every pixel's offset from U[-eps, eps]; ``sign`` puts every pixel at
    +/- eps (a random corner of the ball)."""
    shape = (len(x), m, *x.shape[1:])
    if kind == "uniform":
        noise = (torch.rand(shape, generator=generator) * 2 - 1) * eps
    else:
        noise = (torch.randint(0, 2, shape, generator=generator) * 2 - 1).float() * eps
    return (x[:, None] + noise).clamp(0.0, 1.0)


class ENIConfig(PluginConfig):
    eps: float = Field(default=0.1, gt=0, le=1, description="l_inf radius of the noise")
    n_perturbations: int = Field(default=10, ge=1, description="polluted copies m per sample")
    noise: Literal["uniform", "sign"] = "uniform"
    samples: int | None = Field(default=None, gt=0, description="at most this many samples")
    seed: int = 0


class EmpiricalNoiseInsensitivity(CleanMetric):
    """AISafety eq. 21: the mean over n samples and m polluted copies within l_inf radius eps
    of the absolute cross-entropy change divided by the l_inf distance."""

    name = "eni"
    description = "Mean |loss change| per unit l_inf distance under random noise within eps"
    direction = Direction.LOWER
    unit = "loss / linf"
    category = "structure"
    requires = Capability.SCORES
    Config = ENIConfig

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        cfg = self.config
        generator = torch.Generator().manual_seed(cfg.seed)
        n = len(ctx.y) if cfg.samples is None else min(cfg.samples, len(ctx.y))
        index = torch.randperm(len(ctx.y), generator=generator)[:n].sort().values
        ratios = []
        for part in index.split(max(1, ctx.batch_size)):
            x = ctx.x[part]
            noisy = polluted(x, cfg.n_perturbations, cfg.eps, cfg.noise, generator)
            ratios.append(loss_change_ratios(ctx.predictor, x, ctx.y[part], noisy, ctx.batch_size))
        values = torch.cat(ratios).flatten() if ratios else torch.empty(0)
        values = values[~values.isnan()]
        value = values.mean() if len(values) else math.nan
        return [self.value(value, n, eps=cfg.eps, pairs=len(values), noise=cfg.noise)]
