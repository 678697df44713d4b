"""Robust accuracy and ASR per (attack, budget): exact values on a hand case with adversarial
inputs chosen in advance, agreement with AAW on a real PGD run, and the accuracy-vs-budget
curve as one SQL query over the stored rows."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.attack.base import Attack
from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.base import LoadedDataset
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.accuracy import AdversarialAccuracyWhiteBox
from aisafety.evaluation.metrics.attack_success import AttackSuccessRate, RobustAccuracy
from aisafety.interfaces import AttackFamily, AttackSpec, Capability, EvaluationPlan, Norm
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


class ChosenAttack(Attack):
    """Replaces the batch by adversarial inputs fixed in advance (same order as the data)."""

    name = "chosen"
    family = AttackFamily.SCORE
    norm = Norm.LINF
    requires = Capability.SCORES

    def __init__(self, adversarial: torch.Tensor):
        super().__init__()
        self.adversarial = adversarial

    def perturb(self, predictor, x, y, eps, call):
        return self.adversarial.clone(), torch.ones(len(x), dtype=torch.long)


# Two classes decided by pixel 0 (class 1 when x0 > 0.5). Labels 0, 0, 1, 1, 0.
CLEAN = [0.1, 0.2, 0.9, 0.3, 0.8]  # clean predictions 0, 0, 1, 0, 1: right on 0, 1, 2
ADV = [0.7, 0.2, 0.4, 0.9, 0.1]  # adversarial predictions 1, 0, 0, 1, 0
LABELS = [0, 0, 1, 1, 0]


class FirstPixel(nn.Module):
    def forward(self, x):
        gap = 100 * (x.flatten(1)[:, 0] - 0.5)
        return torch.stack([torch.zeros_like(gap), gap], 1)


def images(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).view(-1, 1, 1, 1)


def test_robust_accuracy_and_asr_by_hand():
    model = TorchPredictor(FirstPixel(), (1, 1, 1), 2, name="hand")
    data = LoadedDataset("hand", images(CLEAN), torch.tensor(LABELS), ("a", "b"))
    ctx = EvaluationContext(model, data, lambda s: ChosenAttack(images(ADV)))
    # l-inf eps 1 is the whole [0, 1] box: the projection keeps the chosen inputs (which move
    # pixel 0 by up to 0.7)
    spec = AttackSpec(name="chosen", eps=1.0)
    # adversarially right: samples 1, 3 and 4; but 3 and 4 were wrong when clean, so their
    # clean inputs stand (a clean mistake is its own adversarial example, attack/base.py's
    # keep_clean_mistakes): only sample 1 -> 1/5, below the clean accuracy 3/5 (before
    # session 19 this was 3/5: the chosen points undid two clean mistakes)
    assert RobustAccuracy().compute(ctx, spec, 1.0)[0].value == pytest.approx(1 / 5)
    # clean-right samples 0, 1, 2; the attack flips 0 and 2 -> 2/3 (sample 4 was wrong already)
    asr = AttackSuccessRate().compute(ctx, spec, 1.0)[0]
    assert (asr.value, asr.n_samples) == (pytest.approx(2 / 3), 3)
    # the RDI paper's eq. 8: misclassified adversarial examples (0 and 2, and the clean
    # mistakes 3 and 4) over all 5, which is 1 - robust accuracy
    rdi_asr = AttackSuccessRate(over="all").compute(ctx, spec, 1.0)[0]
    assert (rdi_asr.value, rdi_asr.n_samples) == (pytest.approx(4 / 5), 5)
    assert rdi_asr.metric == "asr(over=all)"


def test_robust_accuracy_is_aaw_for_a_white_box_attack(zoo_predictor, mnist_subset):
    ctx = EvaluationContext(zoo_predictor, mnist_subset(64), lambda s: PGDLinf(steps=5))
    spec = AttackSpec(name="pgd-linf", config={"steps": 5}, eps=0.2)
    ra = RobustAccuracy().compute(ctx, spec, 0.2)[0].value
    assert ra == AdversarialAccuracyWhiteBox().compute(ctx, spec, 0.2)[0].value
    asr = AttackSuccessRate().compute(ctx, spec, 0.2)[0]
    clean = float(ctx.clean_correct.double().mean())
    # every clean-right sample the attack does not flip is robust, and only those are
    assert ra == pytest.approx(clean * (1 - asr.value), abs=1e-12)
    assert sum(ctx.attack_runs.values()) == 1


def test_accuracy_curve_is_one_sql_query():
    plan = EvaluationPlan.model_validate(
        {
            "dataset": {"limit": 40},
            "attacks": [{"name": "fgsm", "eps": [0.3, 0.1, 0.2]}],
            "metrics": ["ca", "robust-accuracy", "asr"],
        }
    )
    store = ResultStore("sqlite://")
    values = {(v.metric, v.eps): v.value for v in Runner(plan, store, quiet=True).run().values}
    _, rows = store.query("SELECT attack, eps, robust_accuracy FROM accuracy_curves ORDER BY eps")
    assert [(r[0], r[1]) for r in rows] == [("fgsm", e) for e in (0.0, 0.1, 0.2, 0.3)]
    assert rows[0][2] == pytest.approx(values[("ca", None)])  # eps 0: the clean accuracy
    for _attack, eps, accuracy in rows[1:]:
        assert accuracy == pytest.approx(values[("robust-accuracy", eps)])
