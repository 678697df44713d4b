"""Median smoothing, the spatial squeezer of Feature Squeezing (Xu et al., 2018)."""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.defense.base import InputDefense, InputDefenseConfig
from aisafety.defense.windows import windows


class MedianFilterConfig(InputDefenseConfig):
    size: int = Field(default=2, ge=1, le=15, description="window side in pixels (Xu et al.: 2)")


class MedianFilter(InputDefense):
    """Per-channel median over a ``size`` x ``size`` window, edges mirrored.

    For an even window the upper of the two middle values is taken, as
    ``scipy.ndimage.median_filter`` (which Xu et al. used) does. PyTorch passes the
    gradient to the selected pixel, which is the exact gradient, so BPDA keeps it.
    """

    name = "median-filter"
    description = "Median filter over a size x size window (Feature Squeezing, Xu et al. 2018)"
    Config = MedianFilterConfig
    differentiable = True

    def transform_copies(self) -> float:
        """Each pixel's window (size^2 copies), sorted values and int64 indices, and the
        window gradients: about 102 copies measured at size 5."""
        return 6.0 * self.config.size**2 + 8

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        size = self.config.size
        if size == 1:
            return x
        return windows(x, size).sort(dim=-1).values[..., size * size // 2]
