"""Digital and colour corruptions: brightness, contrast, saturate, elastic transform,
pixelate, JPEG compression."""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
import torch
from PIL import Image

from aisafety import randomness
from aisafety.corruption import filters
from aisafety.corruption.params import SeverityTable

Tensor = torch.Tensor


def shift_value(x: Tensor, shift: float) -> Tensor:
    """Add ``shift`` to the HSV value (max over channels), keeping hue and saturation.

    At fixed hue and saturation RGB is proportional to V, so every channel scales by
    ``V' / V`` with ``V' = clip(V + shift, 0, 1)``; a black pixel (hue 0, saturation 0 in
    skimage) becomes the grey ``V'``. For one channel this is ``clip(x + shift, 0, 1)``.
    """
    value = x.amax(1, keepdim=True)
    new_value = (value + shift).clamp(0, 1)
    if x.shape[1] == 1:
        return new_value
    scaled = x * (new_value / value.clamp_min(1e-12))
    return torch.where((x == value) | (value <= 0), new_value, scaled)


def brightness(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """HSV ``V <- clip(V + c, 0, 1)``."""
    return shift_value(x, table.brightness[severity - 1])


def contrast(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """``(x - m) * c + m`` with ``m`` the per-image, per-channel mean."""
    mean = x.mean(dim=(2, 3), keepdim=True)
    return (x - mean) * table.contrast[severity - 1] + mean


def saturate(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """HSV ``S <- clip(S * a + b, 0, 1)``, hue and value kept.

    RGB: at fixed hue and value, ``V - channel`` is proportional to S, so each channel
    becomes ``V - (V - channel) * S' / S``. A grey pixel has S = 0 and hue 0 (red) in skimage,
    so a positive ``b`` (the two highest severities) tints it red: ``(V, V (1 - S'), V (1 - S'))``,
    as the reference does.

    Grey images arrive here as three equal channels (``base.corrupt``): nothing changes where
    ``b = 0``; where ``b > 0`` the red tint darkens their luma to ``V (0.299 + 0.701 (1 - b))``.
    """
    scale, shift = table.saturate[severity - 1]
    value = x.amax(1, keepdim=True)
    delta = value - x.amin(1, keepdim=True)
    sat = torch.where(value > 0, delta / value.clamp_min(1e-12), 0.0)
    new_sat = (sat * scale + shift).clamp(0, 1)
    coloured = value - (value - x) * (new_sat / sat.clamp_min(1e-12))
    red = torch.cat([value, value * (1 - new_sat), value * (1 - new_sat)], dim=1)
    return torch.where(sat > 0, coloured, red)


@lru_cache(maxsize=64)
def pil_box_matrix(in_size: int, out_size: int) -> Tensor:
    """The (out x in) matrix of Pillow's BOX resampling along one axis (``precompute_coeffs``
    in libImaging/Resample.c, box filter ``-0.5 < t <= 0.5``)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 0.5 * filterscale
    matrix = torch.zeros(out_size, in_size, dtype=torch.float64)
    for xx in range(out_size):
        centre = (xx + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), in_size)
        for x in range(lo, hi):
            t = (x - centre + 0.5) / filterscale
            matrix[xx, x] = 1.0 if -0.5 < t <= 0.5 else 0.0
        total = matrix[xx].sum()
        if total > 0:
            matrix[xx] /= total
    return matrix


def pixelate(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """PIL BOX resize to ``int(size * c)`` and back, as one matrix per axis."""
    factor = table.pixelate[severity - 1]
    h, w = x.shape[-2:]
    small_h, small_w = max(1, int(h * factor)), max(1, int(w * factor))
    rows = pil_box_matrix(small_h, h) @ pil_box_matrix(h, small_h)
    cols = pil_box_matrix(small_w, w) @ pil_box_matrix(w, small_w)
    return filters.separable(x, rows.to(x.device), cols.to(x.device))


def jpeg(x: Tensor, quality: int) -> Tensor:
    """Encode and decode every image with Pillow's libjpeg (8-bit, 4:2:0 chroma for RGB)."""
    n, c, h, w = x.shape
    pixels = (x.detach().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    pixels = pixels.permute(0, 2, 3, 1).numpy()
    out = np.empty_like(pixels)
    mode = "L" if c == 1 else "RGB"
    for i in range(n):
        image = Image.fromarray(pixels[i, :, :, 0] if c == 1 else pixels[i], mode=mode)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
        decoded = np.asarray(Image.open(io.BytesIO(buffer.getvalue())))
        out[i] = decoded.reshape(h, w, c)
    result = torch.from_numpy(out).permute(0, 3, 1, 2).to(device=x.device, dtype=x.dtype)
    return result / 255


def jpeg_compression(
    x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable
) -> Tensor:
    return jpeg(x, table.jpeg_compression[severity - 1])


def elastic_transform(
    x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable
) -> Tensor:
    """A random affine warp (reflected borders), then a smooth random displacement field.

    Sizes are fractions of the shorter side S (the reference: of its IMSIZE). Affine: the three
    points ``centre + (S//3, S//3)``, ``centre + (S//3, -S//3)``, ``centre - (S//3, S//3)``
    move by U(-a, a) each; OpenCV warpAffine (bilinear, BORDER_REFLECT_101). Field: U(-1, 1)
    per pixel, Gaussian-smoothed (sigma, truncate 3, scipy 'reflect'), times alpha;
    scipy map_coordinates (bilinear, 'reflect').
    """
    alpha, sigma, jitter = (v * min(x.shape[-2:]) for v in table.elastic_transform[severity - 1])
    n, _, h, w = x.shape
    device = x.device
    square = min(h, w) // 3
    cx, cy = w // 2, h // 2
    src = torch.tensor(
        [[cx + square, cy + square], [cx + square, cy - square], [cx - square, cy - square]],
        dtype=torch.float64, device=device,
    )  # fmt: skip
    noise = randomness.rand((n, 3, 2), gen, device, torch.float64)
    dst = src + jitter * (2 * noise - 1)
    ones = torch.ones((n, 3, 1), dtype=torch.float64, device=device)
    # inverse map: output (dst) pixel -> input (src) pixel, as warpAffine samples
    inverse = torch.linalg.solve(torch.cat([dst, ones], 2), src.expand(n, 3, 2))  # (n, 3, 2)
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float64, device=device),
        torch.arange(w, dtype=torch.float64, device=device),
        indexing="ij",
    )
    points = torch.stack([xs, ys, torch.ones_like(xs)], -1).view(1, h * w, 3)
    mapped = torch.matmul(points, inverse).view(n, h, w, 2)
    grid = torch.stack(
        [2 * mapped[..., 0] / max(w - 1, 1) - 1, 2 * mapped[..., 1] / max(h - 1, 1) - 1], -1
    )
    warped = torch.nn.functional.grid_sample(
        x, grid.to(x.dtype), mode="bilinear", padding_mode="reflection", align_corners=True
    )
    field = 2 * randomness.rand((n, 2, h, w), gen, device, torch.float64) - 1
    if sigma > 0:
        field = filters.gaussian_blur(field, sigma, truncate=3.0, mode="symmetric")
    field = field * alpha
    return filters.sample_pixels(
        warped, ys + field[:, 1], xs + field[:, 0], padding_mode="reflection"
    )
