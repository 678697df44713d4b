"""Bit-depth reduction, the colour-depth squeezer of Feature Squeezing (Xu et al., 2018)."""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.defense.base import InputDefense, InputDefenseConfig


class BitDepthConfig(InputDefenseConfig):
    bits: int = Field(default=4, ge=1, le=8)


class BitDepthReduction(InputDefense):
    """BPDA surrogate: the identity, i.e. straight-through rounding (Athalye et al. 2018)."""

    name = "bit-depth"
    description = "Quantise each pixel to 2^bits levels (Feature Squeezing, Xu et al. 2018)"
    Config = BitDepthConfig

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        levels = 2**self.config.bits - 1
        return torch.round(x * levels) / levels
