"""Random resizing and padding (Xie et al., 2018), one independent draw per image.

Xie et al. resize a 299-pixel image to a random side in [299, 331) with nearest-neighbour
interpolation, then place it at a random offset on a zero 331 x 331 canvas. We scale that
recipe to any input: the canvas is ``round(side * canvas_scale)`` (Xie: 331/299), the new
side is drawn uniformly below it, and since our models take a fixed input size, the
canvas is resized back to the input with area-aware bilinear interpolation.

The nearest-neighbour resize and the padding are one gather with per-image indices, so a
batch is transformed at once; it is exactly ``F.interpolate(mode='nearest-exact')``
followed by ``F.pad`` for each image. Every step is differentiable: the randomness, not
the gradient, is what a non-adaptive attacker trips over, and EOT is the adaptive answer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from aisafety import randomness
from aisafety.defense.base import InputDefense, RandomDefenseConfig


class ResizePadConfig(RandomDefenseConfig):
    canvas_scale: float = Field(
        default=331 / 299, gt=1, le=4, description="canvas side / input side (Xie et al.: 331/299)"
    )


class RandomResizePad(InputDefense):
    name = "resize-pad"
    description = "Random resize then random zero padding, per image (Xie et al. 2018)"
    Config = ResizePadConfig
    differentiable = True

    def transform_copies(self) -> float:
        """The placed canvas (``canvas_scale``^2 the input), its gathers and gradients."""
        return 6.0 * self.config.canvas_scale**2 + 8

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        n, _, height, width = x.shape
        canvas = (round(height * self.config.canvas_scale), round(width * self.config.canvas_scale))
        sizes, tops, lefts = self.draw(n, (height, width), canvas)
        placed = resize_and_place(x, sizes, tops, lefts, canvas)
        return F.interpolate(
            placed, size=(height, width), mode="bilinear", align_corners=False, antialias=True
        ).clamp(0, 1)

    def draw(
        self, n: int, shape: tuple[int, int], canvas: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-image (height, width) in [shape, canvas) keeping the aspect, and offsets."""
        height, width = shape
        gen, dev = self.generator, self.device
        extra = randomness.randint(0, max(canvas[0] - height, 1), (n,), gen, dev)
        rows = height + extra
        cols = (rows * width / height).round().long().clamp(width, max(canvas[1] - 1, width))
        unit = randomness.rand((2, n), gen, dev)
        tops = (unit[0] * (canvas[0] - rows + 1)).long()
        lefts = (unit[1] * (canvas[1] - cols + 1)).long()
        return torch.stack([rows, cols], 1), tops, lefts


def resize_and_place(
    x: torch.Tensor,
    sizes: torch.Tensor,
    tops: torch.Tensor,
    lefts: torch.Tensor,
    canvas: tuple[int, int],
) -> torch.Tensor:
    """Nearest-neighbour resize image i to ``sizes[i]`` and paste it at (tops[i], lefts[i])
    on a zero canvas: one batched gather.

    Canvas pixel j of image i shows resized pixel k = j - offset, i.e. source pixel
    floor((k + 1/2) * side / new_side) (the 'nearest-exact' rule), or zero outside.
    """
    n, _, height, width = x.shape
    rows, row_ok = _source_index(canvas[0], tops, sizes[:, 0], height)
    cols, col_ok = _source_index(canvas[1], lefts, sizes[:, 1], width)
    batch = torch.arange(n, device=x.device).view(n, 1, 1)
    gathered = x.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]
    mask = (row_ok[:, :, None] & col_ok[:, None, :]).unsqueeze(-1)
    return (gathered * mask).permute(0, 3, 1, 2)


def _source_index(
    length: int, offsets: torch.Tensor, sizes: torch.Tensor, side: int
) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.arange(length, device=offsets.device)[None, :] - offsets[:, None]
    inside = (k >= 0) & (k < sizes[:, None])
    source = ((2 * k + 1) * side).div(2 * sizes[:, None], rounding_mode="floor")
    return source.clamp(0, side - 1), inside
