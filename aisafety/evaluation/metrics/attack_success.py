"""Robust accuracy and attack success rate per (attack, budget), for every attack family.

Stored once per budget, so one SQL query over ``results`` (or the ``accuracy_curves`` view)
gives the accuracy-vs-budget curve of each attack.

Registered metrics: ``asr``, ``robust-accuracy``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import AttackMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import AttackSpec, Capability, Direction, MetricValue


class RobustAccuracy(AttackMetric):
    """The fraction of all samples still classified correctly under the attack; AAW and AAB
    are the same number restricted to white-box or black-box attacks."""

    name = "robust-accuracy"
    description = "Accuracy on the adversarial examples of any attack, per budget"
    direction = Direction.HIGHER
    unit = "fraction"
    requires = Capability.LABELS

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        result = ctx.adversarial(attack, eps)
        return [self.value(result.robust_accuracy, len(result.y), attack, eps)]


class AttackSuccessConfig(PluginConfig):
    over: Literal["clean-correct", "all"] = Field(
        default="clean-correct",
        description="'clean-correct': flipped / clean-correct samples; 'all': misclassified "
        "adversarial examples / all samples (the RDI paper's eq. 8, 1 - robust accuracy)",
    )


class AttackSuccessRate(AttackMetric):
    """Among samples the model classifies correctly when clean, the fraction the attack turns
    wrong. Clean mistakes are left out: they are no success of the attack (the stored
    ``attack_runs.success_rate`` counts them, it is 1 - robust accuracy).

    ``over: all`` gives the RDI paper's ASR = N_err / N over all adversarial samples (eq. 8),
    whose tables (adversarial accuracy = 1 - ASR, eq. 9) need that definition.
    """

    name = "asr"
    description = "Fraction of clean-correct samples that the attack makes misclassified"
    direction = Direction.LOWER
    unit = "fraction"
    requires = Capability.LABELS
    Config = AttackSuccessConfig

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        result = ctx.adversarial(attack, eps)
        if self.config.over == "all":
            n = len(result.y)
            wrong = int((result.adv_pred != result.y).sum())
            return [self.value(wrong / n if n else float("nan"), n, attack, eps)]
        correct = result.clean_pred == result.y
        n = int(correct.sum())
        flipped = int((correct & (result.adv_pred != result.y)).sum())
        return [self.value(flipped / n if n else float("nan"), n, attack, eps)]
