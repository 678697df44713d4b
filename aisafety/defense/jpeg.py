"""JPEG compression as an input defense (Das et al. 2017; Guo et al. 2018)."""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.defense.base import InputDefense, InputDefenseConfig, straight_through_round
from aisafety.defense.jpeg_codec import jpeg_round_trip


class JpegConfig(InputDefenseConfig):
    quality: int = Field(default=75, ge=1, le=100, description="IJG quality, as in Pillow")


class JpegCompression(InputDefense):
    """Encode-decode round trip; gray for one channel, YCbCr 4:2:0 for three.

    Rounding makes the real codec's gradient zero almost everywhere. The BPDA surrogate is
    the same codec with straight-through rounding: identical values, and a gradient that
    keeps what is linear in JPEG (colour conversion, chroma subsampling, clamping).
    """

    name = "jpeg"
    description = "JPEG encode-decode round trip at a given quality (Das et al. 2017)"
    Config = JpegConfig

    def transform_copies(self) -> float:
        """The codec's colour planes, blocks and coefficients: about 25 copies measured."""
        return 40.0

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return jpeg_round_trip(x, self.config.quality)

    def surrogate(self, x: torch.Tensor) -> torch.Tensor:
        return jpeg_round_trip(x, self.config.quality, rounding=straight_through_round)
