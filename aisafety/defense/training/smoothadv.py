"""SmoothAdv (Salman et al. 2019): adversarial training of the smoothed classifier.

Per batch, ``noise_samples`` Gaussian draws delta_1..delta_m are fixed; l2 PGD then
maximises the cross-entropy of the *soft* smoothed classifier, -log(1/m sum_i
softmax(f(x' + delta_i))_y), over the l2 ball of radius ``l2_eps`` around x (Salman et al.'s
SmoothAdv_PGD: start at x, ``steps`` normalised-gradient steps of 2 eps / steps, each put
back into the ball and [0, 1]); the network is trained on the m noisy copies x' + delta_i of
the point found, with the same draws (cross-entropy averaged over copies). The budget is
l2 (the smoothed classifier's norm), hence its own name: the zoo's ``eps`` is l-inf.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.attack.projection import project
from aisafety.config_base import PluginConfig
from aisafety.defense.smoothing.noise import Noise, sample_noise
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.interfaces import Norm


class SmoothAdvConfig(PluginConfig):
    sigma: float = Field(default=0.25, gt=0, description="Gaussian noise std, [0, 1] pixel units")
    l2_eps: float = Field(default=0.5, gt=0, description="l2 radius of the attack (Salman: 0.25-2)")
    steps: int = Field(default=2, ge=1, description="PGD steps on the smoothed classifier (T)")
    noise_samples: int = Field(default=1, ge=1, description="noise draws per image (m)")


def soft_smoothed_loss(
    network: nn.Module, x: torch.Tensor, y: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """Per image, -log of the mean over the draws ``noise`` (m, *x.shape) of softmax(f(x +
    noise))_y: the cross-entropy of the soft smoothed classifier SmoothAdv attacks."""
    m = len(noise)
    logits = network((x.unsqueeze(0) + noise).flatten(0, 1)).view(m, len(x), -1)
    log_p = torch.log_softmax(logits, dim=2).gather(2, y.expand(m, -1)[..., None])[..., 0]
    return -(torch.logsumexp(log_p, dim=0) - torch.log(torch.tensor(float(m))))


def smoothadv_examples(
    network: nn.Module, x: torch.Tensor, y: torch.Tensor, noise: torch.Tensor, eps: float,
    steps: int,
) -> torch.Tensor:  # fmt: skip
    """SmoothAdv_PGD: from x, ``steps`` steps of 2 eps / steps along the normalised gradient
    of ``soft_smoothed_loss``, each projected onto the l2 ball and [0, 1]."""
    step = 2 * eps / steps
    x_adv = x.detach()
    for _ in range(steps):
        x_adv = x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(soft_smoothed_loss(network, x_adv, y, noise).sum(), x_adv)
        norms = grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (x.dim() - 1))
        x_adv = project(x_adv.detach() + step * grad / norms, x, eps, Norm.L2)
    return x_adv.detach()


class SmoothAdv(TrainingDefense):
    name = "smoothadv"
    description = "SmoothAdv (Salman et al. 2019): l2 PGD on the smoothed classifier, then noise"
    Config = SmoothAdvConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        shape = torch.Size([c.noise_samples, *x.shape])
        noise = sample_noise(Noise.GAUSSIAN, c.sigma, shape, step.generator, x.device)
        was_training = network.training
        network.eval()  # the attack does not update batch statistics
        x_adv = smoothadv_examples(network, x, y, noise, c.l2_eps, c.steps)
        network.train(was_training)
        logits = network((x_adv.unsqueeze(0) + noise).flatten(0, 1))
        return F.cross_entropy(logits, y.repeat(c.noise_samples))
