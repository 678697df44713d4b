"""Laplace and uniform noise augmentation: the base models of l1 randomized smoothing.

As Gaussian augmentation does for the l2 certificate (Cohen et al. 2019), training on
x + noise makes the base model accurate under the noise it will be smoothed with: Laplace
noise for Teng et al.'s (2020) l1 certificate, uniform noise on the cube for Yang et al.'s
(2020). The noisy image is not clipped, so the noise keeps its exact distribution.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.smoothing.noise import Noise, sample_noise
from aisafety.defense.training.base import TrainingDefense, TrainingStep


class NoiseAugmentationConfig(PluginConfig):
    sigma: float = Field(
        default=0.5, gt=0, description="Laplace scale b / uniform half-width, [0, 1] pixel units"
    )


class NoiseAugmentation(TrainingDefense):
    noise: ClassVar[Noise]
    Config = NoiseAugmentationConfig

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        noise = sample_noise(self.noise, self.config.sigma, x.shape, step.generator, x.device)
        return F.cross_entropy(network(x + noise), y)


class LaplaceAugmentation(NoiseAugmentation):
    name = "laplace-augmentation"
    description = "train on Laplace-noised images (Teng et al. 2020), the l1 smoothing base model"
    noise = Noise.LAPLACE


class UniformAugmentation(NoiseAugmentation):
    name = "uniform-augmentation"
    description = "train on uniformly noised images (Yang et al. 2020), the l1 smoothing base model"
    noise = Noise.UNIFORM
