"""A seeded small conv net with one residual block: the ReLU net with an Add on which the
joint alpha-CROWN memory estimate is measured by its test and its bench. It lives here,
once, so that both build the same weights without one importing the other (as
``scaled_mlp.py`` does for the dense nets)."""

from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    """``x + b(relu(a(x)))``, two 3x3 convolutions keeping ``channels``: an Add node whose
    two inputs share an earlier node."""

    def __init__(self, channels: int):
        super().__init__()
        self.a = nn.Conv2d(channels, channels, 3, padding=1)
        self.b = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


def small_residual(width: int = 8) -> nn.Module:
    """A CIFAR-shaped (3x16x16) ReLU conv net of ``width`` channels with one ``Residual``
    block, initialised after ``torch.manual_seed(0)``; in eval mode."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(), Residual(width), nn.ReLU(),
        nn.Conv2d(width, width, 4, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(width * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10),
    ).eval()  # fmt: skip
