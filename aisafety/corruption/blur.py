"""Blur corruptions: defocus, glass, motion, zoom and Gaussian blur."""

from __future__ import annotations

from functools import lru_cache

import torch

from aisafety import randomness
from aisafety.corruption import filters
from aisafety.corruption.params import SeverityTable

Tensor = torch.Tensor


def gaussian_blur(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """skimage ``gaussian(x, sigma=c)`` (edge pixels repeated, truncate 4)."""
    return filters.gaussian_blur(x, table.gaussian_blur[severity - 1])


@lru_cache(maxsize=16)
def disk_kernel(radius: float, alias_blur: float) -> Tensor:
    """The reference ``disk()``: a binary disk on a 17x17 grid (radius <= 8) or a
    (2r+1)x(2r+1) one, normalised, then anti-aliased by OpenCV's GaussianBlur of sigma
    ``alias_blur`` (3x3, or 5x5 past radius 8, border BORDER_REFLECT_101); cropped to its
    non-zero support."""
    half, ksize = (8, 3) if radius <= 8 else (int(radius), 5)
    taps = torch.arange(-half, half + 1, dtype=torch.float64)
    disk = ((taps[:, None] ** 2 + taps[None, :] ** 2) <= radius**2).double()
    disk = disk / disk.sum()
    offsets = torch.arange(ksize, dtype=torch.float64) - (ksize - 1) / 2
    g = torch.exp(-(offsets**2) / (2 * alias_blur**2))
    g = g / g.sum()
    blur = filters.correlation_matrix(len(taps), g, "reflect")
    kernel = blur @ disk @ blur.T
    support = (kernel.abs() > 0).any(0).nonzero()
    lo, hi = int(support.min()), int(support.max())
    lo = min(lo, 2 * half - hi)  # keep the kernel centred
    return kernel[lo : 2 * half - lo + 1, lo : 2 * half - lo + 1]


def defocus_blur(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """Correlation with the anti-aliased disk (OpenCV filter2D, BORDER_REFLECT_101)."""
    radius, alias_blur = table.defocus_blur[severity - 1]
    return filters.filter2d(x, disk_kernel(radius, alias_blur), mode="reflect")


def glass_sources(n: int, h: int, w: int, delta: int, gen: torch.Generator, device) -> Tensor:
    """Flat index (N, H*W) of the pixel whose pre-pass value each pixel ends up with.

    The reference visits rows ``h - d .. d + 1`` and columns ``w - d .. d + 1`` in reverse
    raster order and "swaps" each pixel with the one at offset ``randint(-d, d)`` per axis.
    On its H x W x 3 array both sides of that swap are numpy views, so the first assignment
    copies the neighbour into the pixel and the second writes it back unchanged: the pixel
    takes its neighbour's value *as it is at that moment*. A neighbour visited earlier (later
    in raster order) has already taken its own neighbour's value, so values travel along
    chains; for d = 1 (offsets -1, 0) no neighbour is visited earlier and every pixel copies
    an original value. The chains are followed by pointer doubling, a few batched gathers.
    """
    offsets = randomness.randint(-delta, delta, (n, 2, h, w), gen, device)
    rows = torch.arange(h, device=device).view(1, h, 1)
    cols = torch.arange(w, device=device).view(1, 1, w)
    visited = (rows > delta) & (rows <= h - delta) & (cols > delta) & (cols <= w - delta)
    own = (rows * w + cols).expand(n, h, w)
    source = (rows + offsets[:, 1]) * w + (cols + offsets[:, 0])  # dx is drawn first
    source = torch.where(visited, source, own).reshape(n, h * w)
    own = own.reshape(n, h * w)
    visited = visited.reshape(1, h * w).expand(n, h * w)
    chained = visited.gather(1, source) & (source > own) & visited
    while chained.any():
        source, chained = (
            torch.where(chained, source.gather(1, source), source),
            torch.where(chained, chained.gather(1, source), chained),
        )
    return source


def glass_blur(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """Blur, quantise to 8 bits (floor), locally shuffle pixels as the reference's loop
    actually does (``glass_sources``), blur again."""
    sigma, delta, iterations = table.glass_blur[severity - 1]
    n, c, h, w = x.shape
    x = torch.floor(filters.gaussian_blur(x, sigma) * 255) / 255
    for _ in range(iterations):
        source = glass_sources(n, h, w, delta, gen, x.device)
        index = source.unsqueeze(1).expand(n, c, h * w)
        x = torch.gather(x.reshape(n, c, h * w), 2, index).view(n, c, h, w)
    return filters.gaussian_blur(x, sigma)


def motion_blur(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """ImageMagick motion blur (one-sided Gaussian line kernel), angle ~ U(-45, 45) degrees.

    Five angles are drawn per image and severity ``s`` uses the ``s``-th: the reference draws
    a fresh angle for every image and severity, and its severities 3 and 4 have the same
    sigma (2), so their kernels agree to 1e-9 and only the angle tells them apart.
    """
    radius, sigma = table.motion_blur[severity - 1]
    angle = uniform(5 * len(x), -45.0, 45.0, gen, x.device).view(len(x), 5)[:, severity - 1]
    return filters.motion_blur(x, radius, sigma, angle)


def uniform(n: int, low: float, high: float, gen: torch.Generator, device) -> Tensor:
    u = randomness.rand((n,), gen, device, torch.float64)
    return low + (high - low) * u


def zoom_blur(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """Mean of the image and its ``clipped_zoom`` by each factor of the table (separable
    resampling matrices that reproduce the reference's crop + scipy zoom + trim exactly)."""
    factors = table.zoom_blur[severity - 1]
    total = x.clone()
    for factor in factors:
        total += filters.clipped_zoom(x, factor)
    return total / (len(factors) + 1)
