"""R+FGSM: FGSM from a random first step (Tramèr et al., ICLR 2018, "Ensemble Adversarial
Training: Attacks and Defenses", eq. 7).

    x' = x + alpha * sign(N(0, I));   x_adv = x' + (eps - alpha) * sign(grad_x' CE(x', y))

The random step escapes the sharp curvature a gradient-masked model has right at the data
point. ``alpha`` is given relative to the budget (``alpha_ratio``; the paper uses eps/2). The
intermediate point is clipped to [0, 1]; the base class projects the result onto the l-inf
ball and the box.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import cross_entropy_gradient, require_finite_budget
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class RFGSMConfig(AttackConfig):
    alpha_ratio: float = Field(
        default=0.5, ge=0, le=1, description="random step alpha as a fraction of eps (paper: 0.5)"
    )


class RFGSM(Attack):
    name = "r-fgsm"
    family = AttackFamily.GRADIENT
    norm = Norm.LINF
    requires = Capability.GRADIENTS
    chunk_independent = True
    description = "R+FGSM: random sign step, then an FGSM step, l-inf (Tramèr et al. 2018)"
    Config = RFGSMConfig
    targeted = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_finite_budget(self.name, eps)
        alpha = self.config.alpha_ratio * eps
        x_start = (x + alpha * call.streams.signs(x.shape, x.dtype)).clamp(0, 1)
        grad, _ = cross_entropy_gradient(predictor, x_start, y, call.target)
        steps = torch.ones(len(x), dtype=torch.long, device=x.device)
        return x_start + (eps - alpha) * self.threat.ascent(grad), steps
