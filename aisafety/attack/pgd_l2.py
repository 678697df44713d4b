"""PGD under the l2 norm (Madry et al., ICLR 2018, "Towards Deep Learning Models Resistant to
Adversarial Attacks"): normalised-gradient ascent on the cross-entropy with projection.

    x_0 = x + uniform point of the l2 ball of radius eps (clipped to [0, 1])
    x_{t+1} = Proj(x_t + alpha * g / ||g||_2),   g = grad_x CE(x_t, y)

``Proj`` clips to [0, 1], then scales the perturbation back onto the ball when it leaves it
(``threat.L2Threat.project``, which says why in that order). The random start is a point of
the ball with a Gaussian direction and a radius uniform in [0, eps] (as torchattacks does;
``threat.L2Threat.random_start`` says why not uniform in the volume).
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import iterate, require_finite_budget
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class PGDL2Config(AttackConfig):
    steps: int = Field(default=40, gt=0)
    step_size: float | None = Field(
        default=None, gt=0, description="absolute l2 step; default 2.5 * eps / steps (Madry)"
    )
    random_start: bool = True
    early_stop: bool = Field(
        default=False, description="stop moving a sample once it is misclassified"
    )


class PGDL2(Attack):
    name = "pgd-l2"
    family = AttackFamily.GRADIENT
    norm = Norm.L2
    requires = Capability.GRADIENTS
    chunk_independent = True
    description = "Projected gradient descent, l2, random start (Madry et al. 2018)"
    Config = PGDL2Config
    targeted = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_finite_budget(self.name, eps)
        cfg = self.config
        alpha = cfg.step_size if cfg.step_size is not None else 2.5 * eps / cfg.steps
        threat = self.threat
        x_start = x
        if cfg.random_start:
            x_start = threat.random_start(x, eps, call.streams)

        def update(active, x_adv, grad):
            return threat.project(x_adv + alpha * threat.ascent(grad), x[active], eps)

        return iterate(predictor, x_start, y, cfg.steps, cfg.early_stop, update, call.target)
