"""Gaussian data augmentation (Cohen et al., 2019): train on x + N(0, sigma^2).

The base classifier of randomized smoothing must classify noisy inputs well; training on
them is what makes the smoothed classifier accurate. The noisy image is not clipped to
[0, 1], as in Cohen et al.'s code, so the noise stays exactly Gaussian.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.training.base import TrainingDefense, TrainingStep


class GaussianAugmentationConfig(PluginConfig):
    sigma: float = Field(default=0.25, gt=0, description="noise std in [0, 1] pixel units")


def gaussian_noisy(x: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    return x + sigma * torch.randn(x.shape, generator=generator, device=x.device)


class GaussianAugmentation(TrainingDefense):
    name = "gaussian-augmentation"
    description = "train on Gaussian-noised images (Cohen et al. 2019), the smoothing base model"
    Config = GaussianAugmentationConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        return F.cross_entropy(network(gaussian_noisy(x, self.config.sigma, step.generator)), y)
