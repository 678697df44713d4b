"""Mean logit margin on clean data: how far, on average, inputs sit from a label change.

For each sample, margin = z_y - max_{j != y} z_j (the quantity the C&W loss drives below 0):
positive when correctly classified, and larger the more confidently so. The dataset mean is
a cheap, attack-free indicator of robustness headroom; compare it across defenses of one
model (logit scales of different models are not comparable).
"""

from __future__ import annotations

import torch

from aisafety.plugin import Capability, CleanMetric, Direction, EvaluationContext, MetricValue


def logit_margins(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample: true-class logit minus the largest other logit."""
    logits = logits.double()
    true = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.scatter(1, y[:, None], float("-inf"))
    return true - others.amax(1)


class MeanMargin(CleanMetric):
    name = "mean-margin"
    description = "Mean over the dataset of (true-class logit - largest other logit), clean"
    direction = Direction.HIGHER
    unit = "logit"
    category = "behaviour"
    requires = Capability.SCORES

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        ctx.predictor.require(self.requires, f"metric {self.name!r}")
        y = ctx.y.to(torch.long)
        if not len(y):
            return [self.value(float("nan"), 0)]
        margins = logit_margins(ctx.clean_logits.cpu(), y.cpu())
        return [
            self.value(
                margins.mean(),
                len(y),
                fraction_positive=float((margins > 0).double().mean()),
            )
        ]
