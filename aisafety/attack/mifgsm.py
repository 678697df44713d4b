"""MI-FGSM, momentum iterative FGSM (Dong et al., CVPR 2018, "Boosting Adversarial Attacks
with Momentum", Algorithm 1).

    g_{t+1} = mu * g_t + grad_x CE(x_t, y) / ||grad_x CE(x_t, y)||_1
    x_{t+1} = Clip_{x, eps}(x_t + alpha * sign(g_{t+1}))

from x_0 = x, with decay ``mu`` = 1.0 and alpha = eps / steps by default (the paper's
choice). A zero gradient contributes nothing instead of a NaN.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import iterate, require_finite_budget
from aisafety.attack.threat import normalized
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class MIFGSMConfig(AttackConfig):
    steps: int = Field(default=10, gt=0)
    step_size: float | None = Field(
        default=None, gt=0, description="absolute step alpha; default eps / steps"
    )
    decay: float = Field(default=1.0, ge=0, description="momentum decay factor mu")
    early_stop: bool = Field(
        default=False, description="stop moving a sample once it is misclassified"
    )


class MIFGSM(Attack):
    name = "mi-fgsm"
    family = AttackFamily.GRADIENT
    norm = Norm.LINF
    requires = Capability.GRADIENTS
    chunk_independent = True
    description = "Momentum iterative FGSM, l-inf (Dong et al. 2018)"
    Config = MIFGSMConfig
    targeted = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_finite_budget(self.name, eps)
        cfg = self.config
        alpha = cfg.step_size if cfg.step_size is not None else eps / cfg.steps
        momentum = torch.zeros_like(x)
        threat = self.threat

        def update(active, x_adv, grad):
            g = cfg.decay * momentum[active] + normalized(grad, 1)
            momentum[active] = g
            return threat.project(x_adv + alpha * threat.ascent(g), x[active], eps)

        return iterate(predictor, x, y, cfg.steps, cfg.early_stop, update, call.target)
