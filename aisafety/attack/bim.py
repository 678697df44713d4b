"""BIM, the Basic Iterative Method or iterative FGSM (Kurakin, Goodfellow & Bengio, ICLR 2017
workshop, "Adversarial Examples in the Physical World").

    x_0 = x;   x_{t+1} = Clip_{x, eps}(x_t + alpha * sign(grad_x CE(x_t, y)))

No random start (that is what separates it from PGD). The paper takes alpha = 1/255 and
min(eps + 4, 1.25 eps) steps (eps in 1/255 units), so the steps add up to about 1.25 eps; the
default here keeps that total for any number of steps: ``alpha = 1.25 * eps / steps``.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import iterate, require_finite_budget
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class BIMConfig(AttackConfig):
    steps: int = Field(default=10, gt=0)
    step_size: float | None = Field(
        default=None, gt=0, description="absolute step alpha; default 1.25 * eps / steps"
    )
    early_stop: bool = Field(
        default=False, description="stop moving a sample once it is misclassified"
    )


class BIM(Attack):
    name = "bim"
    family = AttackFamily.GRADIENT
    norm = Norm.LINF
    requires = Capability.GRADIENTS
    chunk_independent = True
    description = "Basic Iterative Method (iterative FGSM), l-inf (Kurakin et al. 2017)"
    Config = BIMConfig
    targeted = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_finite_budget(self.name, eps)
        cfg = self.config
        alpha = cfg.step_size if cfg.step_size is not None else 1.25 * eps / cfg.steps
        threat = self.threat

        def update(active, x_adv, grad):
            return threat.project(x_adv + alpha * threat.ascent(grad), x[active], eps)

        return iterate(predictor, x, y, cfg.steps, cfg.early_stop, update, call.target)
