"""Noise corruptions: gaussian, shot (Poisson), impulse (salt and pepper), speckle."""

from __future__ import annotations

import torch

from aisafety import randomness
from aisafety.corruption.params import SeverityTable

Tensor = torch.Tensor


def _randn(x: Tensor, gen: torch.Generator) -> Tensor:
    return randomness.randn(x.shape, gen, x.device, x.dtype)


def gaussian_noise(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """``x + N(0, c^2)`` independently per value."""
    return gaussian(x, table.gaussian_noise[severity - 1], gen)


def gaussian(x: Tensor, sigma: float, gen: torch.Generator) -> Tensor:
    return x + sigma * _randn(x, gen)


def shot_noise(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """Photon noise: ``Poisson(x * c) / c``."""
    return poisson(x, table.shot_noise[severity - 1], gen)


def poisson(x: Tensor, photons: float, gen: torch.Generator) -> Tensor:
    rate = (x * photons).clamp_min(0)
    return torch.poisson(rate.cpu(), generator=gen).to(rate.device) / photons


def impulse_noise(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """skimage ``random_noise(mode='s&p', amount=c)``: each value (channels independently)
    flips with probability ``c``, to 1 or 0 with equal odds."""
    amount = table.impulse_noise[severity - 1]
    flipped = randomness.rand(x.shape, gen, x.device) < amount
    salted = randomness.rand(x.shape, gen, x.device) < 0.5
    return torch.where(flipped, salted.to(x.dtype), x)


def speckle_noise(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """Multiplicative noise: ``x + x * N(0, c^2)``."""
    return speckle(x, table.speckle_noise[severity - 1], gen)


def speckle(x: Tensor, sigma: float, gen: torch.Generator) -> Tensor:
    return x + x * sigma * _randn(x, gen)
