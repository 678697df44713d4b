"""PGD under the l-inf norm (Madry et al., 2018), with optional early stop on success."""

from __future__ import annotations

from collections.abc import Callable

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
        target = call.target
        if not cfg.early_stop:

            def gradient(x_adv: torch.Tensor) -> torch.Tensor:
                return cross_entropy_gradient(predictor, x_adv, y, target)[0]

            steps = torch.full((len(x),), cfg.steps, dtype=torch.long, device=x.device)
            return linf_pgd(gradient, x, x_adv, eps, cfg.steps, alpha), steps
        return self._early_stop(predictor, x, y, x_adv, eps, alpha, target)

    def _early_stop(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        x_adv: torch.Tensor,
        eps: float,
        alpha: float,
        target: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PGD that stops moving each sample once it is misclassified."""
        cfg = self.config
        steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
        lower, upper = LinfThreat.bounds(x, eps)
        active = torch.arange(len(x), device=x.device)
        for _ in counted("iteration", cfg.steps):
            aim = None if target is None else target[active]
            grad, logits = cross_entropy_gradient(predictor, x_adv[active], y[active], aim)
            still = logits.argmax(1) == y[active]
            active, grad = active[still], grad[still]
            if not len(active):
                break
            steps[active] += 1
            moved = x_adv[active] + alpha * grad.sign()
            x_adv[active] = torch.clamp(moved, lower[active], upper[active])
        return x_adv, steps


def linf_pgd(
    gradient: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    x_start: torch.Tensor,
    eps: float,
    steps: int,
    step_size: float,
) -> torch.Tensor:
    """PGD's ascent (Madry et al. 2018): ``steps`` signed-gradient steps of ``step_size``
    from ``x_start``, each clamped to the l-inf eps-ball around ``x`` and [0, 1];
    ``gradient(x_adv)`` is the input gradient of the objective to raise. The attack and
    adversarial training (``defense/adversarial_training.py``) share it."""
    threat = LinfThreat()
    lower, upper = threat.bounds(x, eps)  # once: each step is then one clamp
    x_adv = x_start.detach().clone()
    for _ in counted("iteration", steps):  # in place (an expanded gradient view: untouched)
        x_adv.add_(threat.ascent(gradient(x_adv)), alpha=step_size).clamp_(lower, upper)
    return x_adv
