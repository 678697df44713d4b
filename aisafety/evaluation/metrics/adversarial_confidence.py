"""Confidence metrics over successful adversarial examples: ACAC, ACTC, NTE (DEEPSEC).

Registered metrics: ``acac``, ``actc``, ``nte``.
"""

from __future__ import annotations

import torch

from aisafety.evaluation.base import AttackMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.successful import successful_mask
from aisafety.interfaces import AttackSpec, Direction, MetricValue


def _successful_probs(ctx: EvaluationContext, attack: AttackSpec, eps: float):
    result = ctx.adversarial(attack, eps)
    mask = successful_mask(result)
    return torch.softmax(result.adv_logits[mask].double(), dim=1), result.y[mask]


class AverageConfidenceAdversarialClass(AttackMetric):
    """AISafety eq. 9 writes P_{y_i}; its text and DEEPSEC define the adversarial class."""

    name = "acac"
    description = (
        "Mean confidence of the (wrong) predicted class over successful adversarial examples"
    )
    direction = Direction.LOWER
    unit = "probability"

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        probs, _ = _successful_probs(ctx, attack, eps)
        value = probs.max(1).values.mean() if len(probs) else float("nan")
        return [self.value(value, len(probs), attack, eps)]


class AverageConfidenceTrueClass(AttackMetric):
    name = "actc"
    description = "Mean confidence of the true class over successful adversarial examples"
    direction = Direction.HIGHER
    unit = "probability"

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        probs, y = _successful_probs(ctx, attack, eps)
        value = probs.gather(1, y[:, None]).mean() if len(probs) else float("nan")
        return [self.value(value, len(probs), attack, eps)]


class NoiseToleranceEstimation(AttackMetric):
    """Gap between the adversarial class and the runner-up (DEEPSEC): how much more noise the
    example tolerates before flipping again. Eq. 11 subscripts the *clean* prediction f(x_i)
    and averages over all n; we use the adversarial class f(A(x_i)) and the m successful
    examples, as its text and DEEPSEC do (docs/metrics.md, NTE)."""

    name = "nte"
    description = "Mean gap between the adversarial class's probability and the next highest"
    direction = Direction.LOWER
    unit = "probability"

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        probs, _ = _successful_probs(ctx, attack, eps)
        if not len(probs):
            return [self.value(float("nan"), 0, attack, eps)]
        top2 = probs.topk(2, dim=1).values
        return [self.value((top2[:, 0] - top2[:, 1]).mean(), len(probs), attack, eps)]
