"""A batched JPEG encode-decode round trip in tensor code (baseline JPEG, ITU-T T.81).

It follows what libjpeg (and so Pillow) does: 8-bit samples, JFIF YCbCr with 4:2:0 chroma
subsampling for colour (luma only for one channel), edges replicated to whole blocks, the
8x8 DCT, the Annex K tables scaled by the IJG quality formula, and the triangular ("fancy")
chroma upsampling of the decoder. libjpeg computes in fixed point (integer DCT, scaled
colour conversion), so a decoded pixel can differ from Pillow's by a level or two; the
tests bound the mean difference.

``rounding`` is the one non-linear step besides clamping: ``torch.round`` gives the real
codec (gradient zero almost everywhere); a straight-through rounding gives BPDA a
differentiable codec with the same forward values.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

Rounding = Callable[[torch.Tensor], torch.Tensor]

# ITU-T T.81 Annex K, tables K.1 (luminance) and K.2 (chrominance).
LUMINANCE_TABLE = (
    (16, 11, 10, 16, 24, 40, 51, 61),
    (12, 12, 14, 19, 26, 58, 60, 55),
    (14, 13, 16, 24, 40, 57, 69, 56),
    (14, 17, 22, 29, 51, 87, 80, 62),
    (18, 22, 37, 56, 68, 109, 103, 77),
    (24, 35, 55, 64, 81, 104, 113, 92),
    (49, 64, 78, 87, 103, 121, 120, 101),
    (72, 92, 95, 98, 112, 100, 103, 99),
)
CHROMINANCE_TABLE = (
    (17, 18, 24, 47, 99, 99, 99, 99),
    (18, 21, 26, 66, 99, 99, 99, 99),
    (24, 26, 56, 99, 99, 99, 99, 99),
    (47, 66, 99, 99, 99, 99, 99, 99),
    (99, 99, 99, 99, 99, 99, 99, 99),
    (99, 99, 99, 99, 99, 99, 99, 99),
    (99, 99, 99, 99, 99, 99, 99, 99),
    (99, 99, 99, 99, 99, 99, 99, 99),
)

# JFIF colour conversion (full-range BT.601).
RGB_TO_YCBCR = (
    (0.299, 0.587, 0.114),
    (-0.168735892, -0.331264108, 0.5),
    (0.5, -0.418687589, -0.081312411),
)
YCBCR_TO_RGB = (
    (1.0, 0.0, 1.402),
    (1.0, -0.344136286, -0.714136286),
    (1.0, 1.772, 0.0),
)


def quantization_table(base: tuple[tuple[int, ...], ...], quality: int) -> torch.Tensor:
    """IJG ``jpeg_set_quality`` scaling of an Annex K table, clamped to baseline [1, 255]."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    table = (torch.tensor(base, dtype=torch.int64) * scale + 50) // 100
    return table.clamp(1, 255).to(torch.float32)


def dct_matrix() -> torch.Tensor:
    """Orthonormal 8-point DCT-II: the JPEG FDCT is ``C @ block @ C.T``."""
    k = torch.arange(8, dtype=torch.float64)
    matrix = torch.cos((2 * k[None, :] + 1) * k[:, None] * math.pi / 16) * math.sqrt(2 / 8)
    matrix[0] /= math.sqrt(2)
    return matrix.to(torch.float32)


def jpeg_round_trip(
    x: torch.Tensor, quality: int, rounding: Rounding = torch.round
) -> torch.Tensor:
    """Encode and decode a batch in [0, 1] (N, 1 or 3, H, W); returns the decoded batch."""
    if x.shape[1] not in (1, 3):
        raise ValueError(f"JPEG codes 1 (gray) or 3 (RGB) channels, got {x.shape[1]}")
    samples = rounding(x.clamp(0, 1) * 255)
    if x.shape[1] == 1:
        luma = _code_plane(samples[:, 0], quality, LUMINANCE_TABLE, rounding)
        return luma.unsqueeze(1) / 255
    return _code_colour(samples, quality, rounding) / 255


def _code_colour(rgb: torch.Tensor, quality: int, rounding: Rounding) -> torch.Tensor:
    height, width = rgb.shape[-2:]
    offset = torch.tensor([0.0, 128.0, 128.0], device=rgb.device).view(1, 3, 1, 1)
    ycc = _mix(rgb, RGB_TO_YCBCR) + offset
    ycc = rounding(ycc).clamp(0, 255)
    luma = _code_plane(ycc[:, 0], quality, LUMINANCE_TABLE, rounding)
    # 4:2:0: average 2x2 blocks of the edge-replicated image, code at half size, upsample.
    padded = F.pad(ycc[:, 1:], (0, width % 2, 0, height % 2), mode="replicate")
    chroma = F.avg_pool2d(padded, 2)
    coded = torch.stack(
        [_code_plane(chroma[:, c], quality, CHROMINANCE_TABLE, rounding) for c in (0, 1)], 1
    )
    # libjpeg's "fancy" upsampling: weights 3/4 and 1/4 (bilinear), integer samples.
    upsampled = rounding(F.interpolate(coded, scale_factor=2, mode="bilinear", align_corners=False))
    ycc = torch.cat([luma.unsqueeze(1), upsampled[..., :height, :width] - 128], dim=1)
    return rounding(_mix(ycc, YCBCR_TO_RGB)).clamp(0, 255)


def _mix(x: torch.Tensor, matrix: tuple[tuple[float, ...], ...]) -> torch.Tensor:
    return torch.einsum("oc,nchw->nohw", torch.tensor(matrix, dtype=x.dtype, device=x.device), x)


def _code_plane(
    plane: torch.Tensor, quality: int, table: tuple[tuple[int, ...], ...], rounding: Rounding
) -> torch.Tensor:
    """Blockwise DCT, quantise, dequantise, inverse DCT of (N, H, W) samples in [0, 255]."""
    n, height, width = plane.shape
    rows, cols = -(-height // 8), -(-width // 8)
    padded = F.pad(plane.unsqueeze(1), (0, cols * 8 - width, 0, rows * 8 - height), "replicate")
    blocks = padded.view(n, rows, 8, cols, 8).transpose(2, 3) - 128
    dct, q = dct_matrix().to(plane.device), quantization_table(table, quality).to(plane.device)
    coefficients = dct @ blocks @ dct.T
    restored = dct.T @ (rounding(coefficients / q) * q) @ dct
    decoded = rounding(restored + 128).clamp(0, 255)
    return decoded.transpose(2, 3).reshape(n, rows * 8, cols * 8)[:, :height, :width]
