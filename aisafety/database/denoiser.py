"""The denoiser + classifier network of HGD (Liao et al., CVPR 2018), sized for MNIST.

Liao et al.'s DUNET is a U-Net that predicts the adversarial perturbation; the defended
model is classifier(x - denoiser(x)). Ours keeps that shape at MNIST scale: two stride-2
encoder stages (28 -> 14 -> 7), two upsampling stages with skip connections, a 1x1 output
convolution, width 8 (cheap enough to train on a shared CPU). It works on the classifier's
normalised input, so the classifier (``mnist-cnn``, frozen while the denoiser trains) is
used exactly as shipped.
"""

from __future__ import annotations

import torch
from torch import nn


def _block(fan_in: int, fan_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(fan_in, fan_out, 3, stride=stride, padding=1), nn.ReLU(),
        nn.Conv2d(fan_out, fan_out, 3, padding=1), nn.ReLU(),
    )  # fmt: skip


class Denoiser(nn.Module):
    """Predicts the perturbation of a (normalised) image; returns the image minus it."""

    def __init__(self, channels: int = 1, width: int = 8):
        super().__init__()
        self.down0 = _block(channels, width)
        self.down1 = _block(width, 2 * width, stride=2)
        self.down2 = _block(2 * width, 2 * width, stride=2)
        self.up1 = _block(4 * width, 2 * width)
        self.up0 = _block(3 * width, width)
        self.out = nn.Conv2d(width, channels, 1)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d0 = self.down0(x)
        d1 = self.down1(d0)
        d2 = self.down2(d1)
        u1 = self.up1(torch.cat([self.upsample(d2), d1], 1))
        u0 = self.up0(torch.cat([self.upsample(u1), d0], 1))
        return x - self.out(u0)


class DenoisedClassifier(nn.Module):
    """classifier(denoiser(x)); the state dict keeps the two apart ("denoiser.", "classifier.")."""

    def __init__(self, denoiser: nn.Module, classifier: nn.Module):
        super().__init__()
        self.denoiser = denoiser
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.denoiser(x))
