"""FGSM: one signed-gradient step of size eps (Goodfellow et al., 2015)."""

from __future__ import annotations

import torch

from aisafety.attack.base import Attack
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import cross_entropy_gradient
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class FGSM(Attack):
    name = "fgsm"
    family = AttackFamily.GRADIENT
    norm = Norm.LINF
    requires = Capability.GRADIENTS
    chunk_independent = True
    description = "Fast Gradient Sign Method, a single l-inf step (Goodfellow et al. 2015)"
    targeted = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        grad, _ = cross_entropy_gradient(predictor, x, y, call.target)
        steps = torch.ones(len(x), dtype=torch.long, device=x.device)
        return x + eps * self.threat.ascent(grad), steps
