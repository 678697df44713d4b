"""Spatial smoothing: a local low-pass filter (Gaussian or mean) in front of the model.

A Gaussian or box filter is the "local smoothing" squeezer Xu et al. (2018) compare the
median against, and the smoothing transform evaluated by Athalye et al. (2018). It is linear
and differentiable, so it obfuscates nothing: PyTorch's gradient already is the adaptive one.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from aisafety.defense.base import InputDefense, InputDefenseConfig
from aisafety.defense.windows import symmetric_pad


class SpatialSmoothingConfig(InputDefenseConfig):
    kernel: Literal["gaussian", "mean"] = "gaussian"
    sigma: float = Field(default=1.0, gt=0, description="Gaussian std in pixels")
    truncate: float = Field(
        default=4.0, gt=0, description="Gaussian radius in sigmas (scipy's default)"
    )
    size: int = Field(default=3, ge=1, le=31, description="mean filter window side")


class SpatialSmoothing(InputDefense):
    """Separable filter per channel with scipy.ndimage's mirrored edges, so it matches
    ``gaussian_filter(sigma, truncate)`` and ``uniform_filter(size)`` on each image."""

    name = "spatial-smoothing"
    description = "Gaussian or mean filter per channel (local smoothing, Xu et al. 2018)"
    Config = SpatialSmoothingConfig
    differentiable = True

    def transform_copies(self) -> float:
        """Two 1-D convolutions of ``len(weights)`` taps, each unfolded by the convolution:
        about 35 copies measured for the default 9-tap Gaussian."""
        return 4.0 * len(self.weights) + 8

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weights = self._weights().to(self.device)

    def _weights(self) -> torch.Tensor:
        cfg = self.config
        if cfg.kernel == "mean":
            return torch.full((cfg.size,), 1.0 / cfg.size)
        radius = int(cfg.truncate * cfg.sigma + 0.5)
        offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
        weights = torch.exp(-0.5 * (offsets / cfg.sigma) ** 2)
        return (weights / weights.sum()).to(torch.float32)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        size = len(self.weights)
        n, channels, height, width = x.shape
        planes = symmetric_pad(x, size).reshape(n * channels, 1, height + size - 1, -1)
        # scipy correlates (no kernel flip): conv2d in PyTorch is a correlation too.
        planes = F.conv2d(planes, self.weights.view(1, 1, 1, size))
        planes = F.conv2d(planes, self.weights.view(1, 1, size, 1))
        return planes.reshape(n, channels, height, width).clamp(0, 1)
