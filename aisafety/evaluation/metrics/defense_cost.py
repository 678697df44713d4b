"""What a defense costs on clean data: CAV, CRR, CSR, CCV, COS (DEEPSEC, AISafety eqs. 15-19).

The evaluated model is the defended one (f^d); the plan's ``reference_model`` is the original
model f. Every metric reads the clean outputs of both, each computed once by the context.

Registered metrics: ``cav``, ``ccv``, ``cos``, ``crr``, ``csr``.
"""

from __future__ import annotations

import torch

from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import Capability, Direction, MetricValue


def jensen_shannon(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Row-wise Jensen-Shannon divergence in nats (natural log, as DEEPSEC's COS).

    Zero probabilities contribute 0 (the limit of p log p), so one-hot rows are fine.
    """
    m = (p + q) / 2

    def kl_to_m(a: torch.Tensor) -> torch.Tensor:
        return torch.where(a > 0, a * (a.log() - m.log()), torch.zeros_like(a)).sum(1)

    return (kl_to_m(p) + kl_to_m(q)) / 2


class _DefenseCost(CleanMetric):
    needs_reference = True
    category = "defense"

    def _pair(self, ctx: EvaluationContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample correctness of the reference f and of the evaluated (defended) f^d."""
        return ctx.reference.pred == ctx.y, ctx.clean_correct

    def _value(self, ctx: EvaluationContext, value: float, n: int) -> MetricValue:
        return self.value(value, n, reference=ctx.reference.name)


class ClassificationAccuracyVariance(_DefenseCost):
    """AISafety eq. 15: ACC(f^d) - ACC(f); negative when the defense costs clean accuracy."""

    name = "cav"
    description = "Clean accuracy of the evaluated model minus that of the reference model"
    direction = Direction.HIGHER
    unit = "fraction"
    requires = Capability.LABELS

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        reference, defended = self._pair(ctx)
        value = defended.double().mean() - reference.double().mean()
        return [self._value(ctx, value, len(ctx.y))]


class ClassificationRectifyRatio(_DefenseCost):
    """AISafety eq. 16: the fraction of all samples f got wrong and f^d gets right."""

    name = "crr"
    description = "Fraction of samples the reference misclassifies and the evaluated model fixes"
    direction = Direction.HIGHER
    unit = "fraction"
    requires = Capability.LABELS

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        reference, defended = self._pair(ctx)
        return [self._value(ctx, (~reference & defended).double().mean(), len(ctx.y))]


class ClassificationSacrificeRatio(_DefenseCost):
    """AISafety eq. 17: the fraction of all samples f got right and f^d gets wrong."""

    name = "csr"
    description = "Fraction of samples the reference gets right and the evaluated model breaks"
    direction = Direction.LOWER
    unit = "fraction"
    requires = Capability.LABELS

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        reference, defended = self._pair(ctx)
        return [self._value(ctx, (reference & ~defended).double().mean(), len(ctx.y))]


class ClassificationConfidenceVariance(_DefenseCost):
    """AISafety eq. 18: mean |P_y(x) - P^d_y(x)| over samples both models classify right."""

    name = "ccv"
    description = (
        "Mean absolute change of the true-class probability, over samples both models get right"
    )
    direction = Direction.LOWER
    unit = "probability"

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        both = self._both_correct(ctx)
        y = ctx.y[both, None]
        p_ref = ctx.reference.probs[both].gather(1, y)[:, 0]
        p_def = torch.softmax(ctx.clean_logits[both].double(), 1).gather(1, y)[:, 0]
        value = (p_ref - p_def).abs().mean() if len(y) else float("nan")
        return [self._value(ctx, value, len(y))]

    def _both_correct(self, ctx: EvaluationContext) -> torch.Tensor:
        reference, defended = self._pair(ctx)
        return reference & defended


class ClassificationOutputStability(ClassificationConfidenceVariance):
    """AISafety eq. 19: mean Jensen-Shannon divergence between the two models' softmax outputs,
    over samples both classify right (DEEPSEC's COS, natural log)."""

    name = "cos"
    description = (
        "Mean Jensen-Shannon divergence (nats) between the reference's and the evaluated "
        "model's outputs, over samples both get right"
    )
    direction = Direction.LOWER
    unit = "nats"

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        both = self._both_correct(ctx)
        p = ctx.reference.probs[both]
        q = torch.softmax(ctx.clean_logits[both].double(), dim=1)
        value = jensen_shannon(p, q).mean() if len(p) else float("nan")
        return [self._value(ctx, value, len(p))]
