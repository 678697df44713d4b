"""MACER (Zhai et al. 2020): train the smoothed classifier for a large certified radius.

Per batch, ``noise_samples`` Gaussian copies of each image give the soft smoothed
classifier g(x) = mean softmax(f(x + noise)). The loss is the cross-entropy of g plus, for
the images g gets right, a hinge on the soft radius sigma/2 (Phi^-1(g_A) - Phi^-1(g_B)) of
the top two classes (computed on logits scaled by ``beta``): it pushes every margin below
``gamma`` up, with weight ``lbd``. Unlike adversarial training it needs no attack, only
``noise_samples`` forward passes per image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.smoothing.noise import Noise, sample_noise
from aisafety.defense.training.base import TrainingDefense, TrainingStep


class MacerConfig(PluginConfig):
    sigma: float = Field(default=0.25, gt=0, description="Gaussian noise std, [0, 1] pixel units")
    noise_samples: int = Field(default=16, ge=2, description="noisy copies per image (k)")
    lbd: float = Field(default=12.0, ge=0, description="weight of the radius hinge (lambda)")
    gamma: float = Field(default=8.0, gt=0, description="hinge: margins above it cost nothing")
    beta: float = Field(default=16.0, gt=0, description="inverse temperature of the radius term")


def soft_radius_hinge(
    logits: torch.Tensor, y: torch.Tensor, beta: float, gamma: float
) -> torch.Tensor:
    """Sum over correctly classified images of max(0, gamma - (Phi^-1(g_A) - Phi^-1(g_B))),
    ``logits`` (copies, batch, classes); images whose margin is not finite are skipped."""
    g = torch.softmax(beta * logits, dim=2).mean(0)
    top2 = g.topk(2, dim=1)
    a, b = top2.values[:, 0], top2.values[:, 1]
    with torch.no_grad():  # choose first: Phi^-1(1) = inf would put NaN in the gradient
        margin = torch.special.ndtri(a) - torch.special.ndtri(b)
        keep = (top2.indices[:, 0] == y) & torch.isfinite(margin) & (margin <= gamma)
    margin = torch.special.ndtri(a[keep]) - torch.special.ndtri(b[keep])
    return (gamma - margin).sum()


class Macer(TrainingDefense):
    name = "macer"
    description = "MACER (Zhai et al. 2020): maximise the smoothed classifier's certified radius"
    Config = MacerConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        copies = x.unsqueeze(0).expand(c.noise_samples, *x.shape)
        noise = sample_noise(Noise.GAUSSIAN, c.sigma, copies.shape, step.generator, x.device)
        logits = network((copies + noise).flatten(0, 1)).view(c.noise_samples, len(x), -1)
        smoothed = torch.softmax(logits, dim=2).mean(0)
        classification = F.nll_loss(torch.log(smoothed + 1e-10), y, reduction="sum")
        hinge = soft_radius_hinge(logits, y, c.beta, c.gamma)
        return (classification + c.lbd * c.sigma / 2 * hinge) / len(x)
