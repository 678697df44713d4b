"""PGD under the l-inf norm (Madry et al., 2018), with optional early stop on success."""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import cross_entropy_gradient
from aisafety.attack.threat import LinfThreat
from aisafety.attack.work import counted
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class PGDConfig(AttackConfig):
    steps: int = Field(default=40, gt=0)
    step_size: float | None = Field(
        default=None, gt=0, description="absolute step; default 2.5 * eps / steps (Madry et al.)"
    )
    random_start: bool = True
    early_stop: bool = Field(
        default=False,
        description="stop moving a sample once it is misclassified: same robust accuracy, "
        "fewer gradient computations; the perturbation is then not loss-maximal",
    )


class PGDLinf(Attack):
    name = "pgd-linf"
    family = AttackFamily.GRADIENT
    norm = Norm.LINF
    requires = Capability.GRADIENTS
    chunk_independent = True
    description = "Projected gradient descent, l-inf, random start (Madry et al. 2018)"
    Config = PGDConfig
    targeted = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        alpha = cfg.step_size if cfg.step_size is not None else 2.5 * eps / cfg.steps
        x_adv = x.clone()
        if cfg.random_start:
            x_adv = self.threat.random_start(x, eps, call.streams)
        steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
        # the l-inf ball intersected with [0, 1], once: each step is then one clamp
        lower, upper = LinfThreat.bounds(x, eps)
        target = call.target
        # Without early stop every sample stays active: a slice keeps the updates in place.
        active: torch.Tensor | slice = (
            torch.arange(len(x), device=x.device) if cfg.early_stop else slice(None)
        )
        for _ in counted("iteration", cfg.steps):
            aim = None if target is None else target[active]
            grad, logits = cross_entropy_gradient(predictor, x_adv[active], y[active], aim)
            if cfg.early_stop:
                still = logits.argmax(1) == y[active]
                active, grad = active[still], grad[still]  # type: ignore[index]
                if not len(active):  # type: ignore[arg-type]
                    break
            steps[active] += 1
            if cfg.early_stop:
                moved = x_adv[active] + alpha * grad.sign()
                x_adv[active] = torch.clamp(moved, lower[active], upper[active])
            else:  # x_adv in place (the gradient may be an expanded view: not touched)
                x_adv.add_(grad.sign(), alpha=alpha).clamp_(lower, upper)
        return x_adv, steps
