"""One step of the l2 fast gradient method: x + eps * g / ||g||_2, g the loss gradient.

FGSM's l2 counterpart (Goodfellow et al. 2015; Miyato et al. 2016 call it FGM). A single
deterministic step, so a sample's result does not depend on its chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aisafety.plugin import Attack, AttackCall, AttackFamily, Capability, Norm, Predictor


class FGML2(Attack):
    name = "fgm-l2-demo"
    family = AttackFamily.GRADIENT
    norm = Norm.L2
    requires = Capability.GRADIENTS
    description = "one l2 fast gradient step, x + eps g/||g||_2 (a plugin from aisafety.plugin)"
    chunk_independent = True  # no randomness at all

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.detach().requires_grad_(True)
        loss = F.cross_entropy(predictor._logits(x), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x)
        norms = grad.flatten(1).norm(dim=1).clamp_min(1e-12)
        step = eps * grad / norms.view(-1, *([1] * (x.dim() - 1)))
        return (x + step).detach(), torch.ones(len(x), dtype=torch.long, device=x.device)
