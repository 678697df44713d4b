"""``zero-gradient-rate``: the share of samples whose loss gradient is zero or not finite, a
gradient-masking sign.

A white-box attack that follows the cross-entropy gradient learns nothing where that
gradient is exactly zero (a saturated softmax underflows: defensive distillation, Carlini &
Wagner 2017) or NaN. Measured on the correctly classified clean samples, since those are the
ones an attack starts from. The report's sanity checks warn when it is above 10%.
"""

from __future__ import annotations

import torch

from aisafety.attack.gradients import cross_entropy_gradient
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import Capability, Direction, MetricValue


def dead_gradient_mask(predictor, x: torch.Tensor, y: torch.Tensor, batch: int) -> torch.Tensor:
    """True per sample whose input gradient of the CE loss is all zero or has a NaN/inf."""
    parts = []
    for xb, yb in zip(x.split(batch), y.split(batch), strict=True):
        grad, _ = cross_entropy_gradient(
            predictor, xb.to(predictor.device), yb.to(predictor.device)
        )
        flat = grad.flatten(1)
        parts.append(((flat == 0).all(1) | ~torch.isfinite(flat).all(1)).cpu())
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


class ZeroGradientRate(CleanMetric):
    name = "zero-gradient-rate"
    description = "Share of correctly classified samples whose input loss gradient is 0 or NaN"
    direction = Direction.LOWER
    unit = "fraction"
    category = "diagnostic"
    requires = Capability.GRADIENTS

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        correct = ctx.clean_correct
        dead = dead_gradient_mask(ctx.predictor, ctx.x[correct], ctx.y[correct], ctx.batch_size)
        n = int(correct.sum())
        return [self.value(dead.double().mean() if n else 0.0, n, zero_or_nan=int(dead.sum()))]
