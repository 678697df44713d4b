"""Blur corruptions: defocus, glass, motion, zoom and Gaussian blur."""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from aisafety.corruption import filters, params

Tensor = torch.Tensor


def gaussian_blur(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """skimage ``gaussian(x, sigma=c)`` (edge pixels repeated, truncate 4)."""
    return filters.gaussian_blur(x, params.GAUSSIAN_BLUR[severity - 1])


@lru_cache(maxsize=8)
def disk_kernel(radius: float, alias_blur: float) -> Tensor:
    """The reference ``disk()``: a binary disk on a 17x17 grid (radius <= 8), normalised,
    then anti-aliased by a 3x3 Gaussian of sigma ``alias_blur``; cropped to its support."""
    half = 8 if radius <= 8 else math.ceil(radius)
    taps = torch.arange(-half, half + 1, dtype=torch.float64)
    disk = ((taps[:, None] ** 2 + taps[None, :] ** 2) <= radius**2).double()
    disk = disk / disk.sum()
    g = torch.exp(-(torch.arange(-1.0, 2.0, dtype=torch.float64) ** 2) / (2 * alias_blur**2))
    g = g / g.sum()
    size = len(taps)
    blur = filters.correlation_matrix(size, g, "zeros")  # the disk is far from the grid edge
    kernel = blur @ disk @ blur.T
    keep = math.ceil(radius) + 1
    return kernel[half - keep : half + keep + 1, half - keep : half + keep + 1]


def defocus_blur(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """Correlation with the anti-aliased disk (OpenCV filter2D, BORDER_REFLECT_101)."""
    radius, alias_blur = params.DEFOCUS_BLUR[severity - 1]
    return filters.filter2d(x, disk_kernel(radius, alias_blur), mode="reflect")


def glass_blur(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """Blur, quantise to 8 bits, locally shuffle pixels, blur again.

    The reference's sequential swap loop is replaced by one vectorised gather per pass: every
    pixel of the region the loop visits (rows and columns ``d+1 .. size-d``) takes the value
    at an offset drawn from ``params.GLASS_SHUFFLE``, the displacement distribution that loop
    produces (measured; see docs/corruptions.md). Values can repeat, where the reference
    permutes them.
    """
    sigma, delta, iterations = params.GLASS_BLUR[severity - 1]
    n, _, h, w = x.shape
    x = torch.floor(filters.gaussian_blur(x, sigma) * 255) / 255
    offsets = torch.tensor([o for o, _ in params.GLASS_SHUFFLE], device=x.device)
    probs = torch.tensor([p for _, p in params.GLASS_SHUFFLE], dtype=torch.float64)
    cdf = (probs.cumsum(0) / probs.sum()).to(x.device)
    rows = torch.arange(h, device=x.device).view(1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, w)
    region = (rows > delta) & (rows <= h - delta) & (cols > delta) & (cols <= w - delta)
    for _ in range(iterations):
        u = torch.rand((n, h, w), generator=gen, device=x.device, dtype=torch.float64)
        choice = torch.searchsorted(cdf, u).clamp_max(len(offsets) - 1)
        dy = torch.where(region, offsets[choice, 0], 0)
        dx = torch.where(region, offsets[choice, 1], 0)
        x = filters.gather_shifted(x, dy, dx)
    return filters.gaussian_blur(x, sigma)


def motion_blur(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """ImageMagick motion blur (one-sided Gaussian line kernel), angle ~ U(-45, 45) degrees.

    Five angles are drawn per image and severity ``s`` uses the ``s``-th: the reference draws
    a fresh angle for every image and severity, and its severities 3 and 4 have the same
    sigma (2), so their kernels agree to 1e-9 and only the angle tells them apart.
    """
    radius, sigma = params.MOTION_BLUR[severity - 1]
    angle = uniform(5 * len(x), -45.0, 45.0, gen, x.device).view(len(x), 5)[:, severity - 1]
    return filters.motion_blur(x, radius, sigma, angle)


def uniform(n: int, low: float, high: float, gen: torch.Generator, device) -> Tensor:
    u = torch.rand(n, generator=gen, device=device, dtype=torch.float64)
    return low + (high - low) * u


def zoom_blur(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """Mean of the image and its ``clipped_zoom`` by each factor of the table (separable
    resampling matrices that reproduce the reference's crop + scipy zoom + trim exactly)."""
    factors = params.ZOOM_BLUR[severity - 1]
    total = x.clone()
    for factor in factors:
        total += filters.clipped_zoom(x, factor)
    return total / (len(factors) + 1)
