"""Clean accuracy (CA) and adversarial accuracy under white-box (AAW) and black-box (AAB) attacks.

Registered metrics: ``aab``, ``aaw``, ``ca``.
"""

from __future__ import annotations

from aisafety.evaluation.base import AttackMetric, CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import AttackFamily, AttackSpec, Capability, Direction, MetricValue


class CleanAccuracy(CleanMetric):
    name = "ca"
    description = "Clean accuracy: fraction of test samples classified correctly"
    direction = Direction.HIGHER
    unit = "fraction"
    requires = Capability.LABELS

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        return [self.value(ctx.clean_correct.double().mean(), len(ctx.y))]


class AdversarialAccuracyWhiteBox(AttackMetric):
    """AISafety eq. 8 counts misclassifications, but its Table II reports an accuracy (higher
    is better) — we follow the table: the fraction still classified correctly."""

    name = "aaw"
    description = "Accuracy on adversarial examples of a white-box attack (robust accuracy)"
    direction = Direction.HIGHER
    unit = "fraction"
    attack_families = frozenset({AttackFamily.GRADIENT})
    requires = Capability.LABELS

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        result = ctx.adversarial(attack, eps)
        return [self.value(result.robust_accuracy, len(result.y), attack, eps)]


class AdversarialAccuracyBlackBox(AdversarialAccuracyWhiteBox):
    """AAB: the same accuracy under attacks that see only scores or labels, or that were
    crafted on a surrogate (transfer). Table III of the AISafety paper."""

    name = "aab"
    description = (
        "Accuracy on adversarial examples of a black-box (score, decision, transfer) attack"
    )
    attack_families = frozenset({AttackFamily.SCORE, AttackFamily.DECISION, AttackFamily.TRANSFER})
