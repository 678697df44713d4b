"""FGSM adversarial training with a random start (Wong et al., 2020, "fast is better than free").

One gradient step from a uniform random point of the eps-ball, with step alpha = 1.25 eps
(the paper's choice; alpha = 2 eps leads to catastrophic overfitting), then
delta = clip(delta + alpha sign(grad), -eps, eps) and x + delta clipped to [0, 1].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.attack.threat import LinfThreat
from aisafety.config_base import PluginConfig
from aisafety.defense.adversarial_training import linear_warmup
from aisafety.defense.training.base import TrainingDefense, TrainingStep


class FGSMTrainingConfig(PluginConfig):
    eps: float = Field(default=0.3, ge=0)
    alpha_ratio: float = Field(default=1.25, gt=0, description="step = alpha_ratio * eps")
    warmup_epochs: float = Field(default=0.0, ge=0)


def fgsm_rs_examples(
    network: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    alpha: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Random start in the eps-ball, one signed-gradient step of size alpha, projected."""
    noise = torch.rand(x.shape, generator=generator, device=x.device)
    delta = ((2 * noise - 1) * eps).requires_grad_(True)
    loss = F.cross_entropy(network((x + delta).clamp(0, 1)), y)
    (grad,) = torch.autograd.grad(loss, delta)
    return LinfThreat.contain_delta(delta.detach() + alpha * grad.sign(), x, eps)


class FGSMAdversarialTraining(TrainingDefense):
    name = "fgsm-at"
    description = "FGSM adversarial training with random start (Wong et al. 2020), l-inf"
    Config = FGSMTrainingConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        eps = linear_warmup(c.eps, c.warmup_epochs, step.progress)
        x_adv = fgsm_rs_examples(network, x, y, eps, c.alpha_ratio * eps, step.generator)
        return F.cross_entropy(network(x_adv), y)
