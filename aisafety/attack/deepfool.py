"""DeepFool (Moosavi-Dezfooli, Fawzi & Frossard, CVPR 2016, "DeepFool: a simple and accurate
method to fool deep neural networks", Algorithms 2 and 3), l2 and l-inf.

At each iteration every class boundary around the current point is linearised:
``f'_k = z_k - z_y`` and ``w'_k = grad z_k - grad z_y`` for the candidate classes k (the true
class and the ``candidates - 1`` classes with the largest clean logits, as in the authors'
code). The closest linearised boundary ``l = argmin_k |f'_k| / ||w'_k||_q`` (q the dual norm:
2 for l2, 1 for l-inf) is crossed with the minimal step

    l2:    r = (|f'_l| / ||w'_l||_2 + 1e-4) * w'_l / ||w'_l||_2
    l-inf: r = (|f'_l| / ||w'_l||_1 + 1e-4) * sign(w'_l)

accumulated into ``r_tot``; the iterate is ``x + (1 + overshoot) * r_tot`` clipped to [0, 1].
The authors' code has no box; here ``r_tot`` is then re-based on the clipped iterate, as ART
does, so the part of a step the box cut off is not carried along for later steps to undo (it
cost 1.6 points of robust accuracy against ART at l2 2.0 on the zoo MNIST model).
A sample stops as soon as it is misclassified, or after ``steps`` iterations. DeepFool is a
minimum-norm attack: it does not look at eps; the base class then projects the result onto
the eps-ball, so a sample whose DeepFool perturbation is larger than eps usually fails.

Batched: one forward and ``candidates`` backward passes over the whole active batch per
iteration (``gradients.class_jacobian``), not one pass per sample.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import class_jacobian
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class DeepFoolConfig(AttackConfig):
    steps: int = Field(default=50, gt=0, description="maximum iterations (max_iter)")
    overshoot: float = Field(default=0.02, ge=0)
    candidates: int = Field(
        default=10, ge=2, description="classes linearised: the true one and the top others"
    )


class _DeepFool(Attack):
    family = AttackFamily.GRADIENT
    requires = Capability.GRADIENTS
    chunk_independent = True
    Config = DeepFoolConfig

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        clean_logits = call.clean_logits
        k = min(cfg.candidates, clean_logits.shape[1])
        others = clean_logits.masked_fill(F.one_hot(y, clean_logits.shape[1]).bool(), -torch.inf)
        classes = torch.cat([y[:, None], others.topk(k - 1, dim=1).indices], dim=1)

        x_adv = x.clone()
        r_tot = torch.zeros_like(x)
        steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
        active = torch.arange(len(x), device=x.device)
        for _ in range(cfg.steps):
            jac, logits = class_jacobian(predictor, x_adv[active], classes[active])
            still = logits.argmax(1) == y[active]
            active, jac, logits = active[still], jac[still], logits[still]
            if not len(active):
                break
            f = logits.gather(1, classes[active])
            f_prime = (f[:, 1:] - f[:, :1]).abs()  # (m, k - 1)
            w_prime = (jac[:, 1:] - jac[:, :1]).flatten(2)  # (m, k - 1, d)
            dual = 2 if self.norm is Norm.L2 else 1
            w_size = torch.linalg.vector_norm(w_prime, ord=dual, dim=2).clamp_min(1e-12)
            distance = f_prime / w_size
            closest = distance.argmin(1)
            rows = torch.arange(len(active), device=x.device)
            w_l, size_l = w_prime[rows, closest], w_size[rows, closest]
            dist_l = distance[rows, closest]
            if self.norm is Norm.L2:
                r = (dist_l + 1e-4)[:, None] * w_l / size_l[:, None]
            else:
                r = (dist_l + 1e-4)[:, None] * w_l.sign()
            x_clean = x[active]
            total = r_tot[active] + r.view_as(x_clean)
            x_adv[active] = moved = (x_clean + (1 + cfg.overshoot) * total).clamp(0, 1)
            # re-base r_tot on the clipped iterate: a component the box cut off must not stay
            # buried in r_tot, where a later step would first have to undo it (ART does this)
            r_tot[active] = (moved - x_clean) / (1 + cfg.overshoot)
            steps[active] += 1
        return x_adv, steps


class DeepFoolL2(_DeepFool):
    name = "deepfool-l2"
    norm = Norm.L2
    description = "DeepFool, minimal l2 perturbation by linearisation (Moosavi-Dezfooli 2016)"


class DeepFoolLinf(_DeepFool):
    name = "deepfool-linf"
    norm = Norm.LINF
    description = "DeepFool, minimal l-inf perturbation by linearisation (Moosavi-Dezfooli 2016)"
