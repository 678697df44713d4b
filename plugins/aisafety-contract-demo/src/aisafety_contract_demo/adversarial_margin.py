"""Mean logit margin on an attack's adversarial examples: how far past (or short of) a label
change the attack left each sample, on average. Positive: the attack left the average
sample classified correctly; compare across budgets of one attack on one model.
"""

from __future__ import annotations

from aisafety.plugin import (
    AttackMetric,
    AttackSpec,
    Capability,
    Direction,
    EvaluationContext,
    MetricValue,
)


class AdversarialMargin(AttackMetric):
    name = "adversarial-margin-demo"
    description = "Mean over samples of (true logit - largest other logit) after the attack"
    direction = Direction.HIGHER
    unit = "logit"
    requires = Capability.SCORES

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        result = ctx.adversarial(attack, eps)
        logits, y = result.adv_logits.double().cpu(), result.y.long().cpu()
        if not len(y):
            return [self.value(float("nan"), 0, attack, eps)]
        true = logits.gather(1, y[:, None]).squeeze(1)
        others = logits.scatter(1, y[:, None], float("-inf")).amax(1)
        return [self.value((true - others).mean(), len(y), attack, eps)]
