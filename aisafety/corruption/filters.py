"""Batched image-processing primitives shared by the corruptions (pure torch, any device).

Linear filters are applied as matrix products: a 1-D correlation of an ``n``-long axis with
a kernel, border handling included, is an ``n x n`` matrix, so a separable filter of a batch
``x`` of shape (N, C, H, W) is ``A @ x @ B.T`` -- two batched BLAS calls that cost the same
for every kernel size and padding mode, on CPU and CUDA alike. A non-separable kernel is a
short sum of separable ones (its singular value decomposition).

Border modes use the names of ``torch.nn.functional.pad`` plus one:

- ``replicate``: ``a a | a b c | c c`` (scipy/skimage ``nearest``, ImageMagick's edge pixels);
- ``reflect``:   ``c b | a b c | b a`` (OpenCV's default BORDER_REFLECT_101, scipy ``mirror``);
- ``symmetric``: ``b a | a b c | c b`` (scipy ``reflect``);
- ``zeros``:     ``0 0 | a b c | 0 0``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from aisafety import randomness

Tensor = torch.Tensor

# ITU-R 601 luma weights, as OpenCV's RGB2GRAY and PIL's "L" conversion use them.
LUMA = (0.299, 0.587, 0.114)


def source_index(index: Tensor, n: int, mode: str) -> Tensor:
    """Map (possibly out-of-range) integer positions on an ``n``-long axis inside it."""
    if mode == "replicate" or n == 1:
        return index.clamp(0, n - 1)
    if mode == "reflect":
        period = 2 * (n - 1)
        index = index.remainder(period)
        return torch.where(index >= n, period - index, index)
    if mode == "symmetric":
        period = 2 * n
        index = index.remainder(period)
        return torch.where(index >= n, period - 1 - index, index)
    raise ValueError(f"unknown border mode {mode!r}; use replicate, reflect or symmetric")


def correlation_matrix(n: int, kernel: Tensor, mode: str) -> Tensor:
    """The ``n x n`` matrix of a centred 1-D correlation with ``kernel`` (odd length)."""
    radius = (len(kernel) - 1) // 2
    rows = torch.arange(n, device=kernel.device)[:, None].expand(n, len(kernel))
    taps = torch.arange(-radius, radius + 1, device=kernel.device)
    positions = rows + taps
    matrix = torch.zeros(n, n, dtype=kernel.dtype, device=kernel.device)
    weights = kernel.expand(n, len(kernel))
    if mode == "zeros":
        inside = (positions >= 0) & (positions < n)
        matrix.index_put_((rows[inside], positions[inside]), weights[inside], accumulate=True)
    else:
        cols = source_index(positions, n, mode)
        index = (rows.reshape(-1), cols.reshape(-1))
        matrix.index_put_(index, weights.reshape(-1), accumulate=True)
    return matrix


def separable(x: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """Apply ``rows`` (H' x H) along the height and ``cols`` (W' x W) along the width."""
    return torch.matmul(torch.matmul(rows.to(x.dtype), x), cols.to(x.dtype).T)


@lru_cache(maxsize=64)
def gaussian_kernel(sigma: float, truncate: float = 4.0) -> Tensor:
    """scipy.ndimage's sampled Gaussian: radius ``int(truncate * sigma + 0.5)``, sum 1."""
    radius = int(truncate * sigma + 0.5)
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (t / sigma) ** 2)
    return kernel / kernel.sum()


def gaussian_blur(
    x: Tensor, sigma: float, truncate: float = 4.0, mode: str = "replicate"
) -> Tensor:
    """skimage.filters.gaussian (default ``mode='nearest'``, ``truncate=4``) on each channel."""
    if sigma <= 0:
        return x
    kernel = gaussian_kernel(float(sigma), float(truncate)).to(x.device)
    h, w = x.shape[-2:]
    return separable(x, correlation_matrix(h, kernel, mode), correlation_matrix(w, kernel, mode))


def filter2d(x: Tensor, kernel: Tensor, mode: str = "reflect") -> Tensor:
    """Correlate each channel with a 2-D ``kernel`` (odd sides), like OpenCV's filter2D."""
    kernel = kernel.to(device=x.device, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(kernel)
    h, w = x.shape[-2:]
    out = torch.zeros_like(x)
    for i in range(len(s)):
        if s[i] <= 1e-9 * s[0]:
            break
        col = u[:, i] * s[i]
        out = out + separable(
            x, correlation_matrix(h, col, mode), correlation_matrix(w, vh[i], mode)
        )
    return out


def box_blur3(x: Tensor) -> Tensor:
    """OpenCV ``blur(img, (3, 3))``: 3x3 mean with BORDER_REFLECT_101."""
    kernel = torch.full((3,), 1.0 / 3.0, dtype=torch.float64, device=x.device)
    h, w = x.shape[-2:]
    return separable(
        x, correlation_matrix(h, kernel, "reflect"), correlation_matrix(w, kernel, "reflect")
    )


def gather_shifted(x: Tensor, dy: Tensor, dx: Tensor, mode: str = "replicate") -> Tensor:
    """``out[n, c, i, j] = x[n, c, i + dy, j + dx]`` for per-sample or per-pixel offsets.

    ``dy``/``dx`` are integer tensors broadcastable to (N, H, W); positions outside the image
    are mapped back in with ``mode``.
    """
    n, c, h, w = x.shape
    rows = torch.arange(h, device=x.device).view(1, h, 1) + dy
    cols = torch.arange(w, device=x.device).view(1, 1, w) + dx
    index = source_index(rows, h, mode) * w + source_index(cols, w, mode)
    index = index.expand(n, h, w).reshape(n, 1, h * w).expand(n, c, h * w)
    return torch.gather(x.reshape(n, c, h * w), 2, index).view(n, c, h, w)


def motion_blur(x: Tensor, radius: float, sigma: float, angle_deg: Tensor) -> Tensor:
    """ImageMagick's ``MotionBlurImage`` with one angle per sample (degrees, (N,) tensor).

    The kernel is one-sided: ``width = 2 * ceil(radius) + 1`` taps ``i = 0 .. width-1`` with
    weights ``exp(-i^2 / (2 sigma^2))`` (normalised) at the integer offsets
    ``(ceil(i cos a - 0.5), ceil(i sin a - 0.5))``; off-image taps read the edge pixel.
    The image is edge-padded once; each tap is then one gather at a per-sample offset into
    the flattened padded image and one in-place multiply-add.
    """
    n, c, h, w = x.shape
    width = 2 * math.ceil(radius) + 1
    taps = torch.arange(width, device=x.device, dtype=torch.float64)
    weights = torch.exp(-(taps**2) / (2.0 * sigma * sigma))
    weights = (weights / weights.sum()).tolist()
    angle = torch.deg2rad(angle_deg.to(device=x.device, dtype=torch.float64))
    off_x = torch.ceil(taps[None, :] * torch.cos(angle)[:, None] - 0.5).long()
    off_y = torch.ceil(taps[None, :] * torch.sin(angle)[:, None] - 0.5).long()
    pad = width - 1
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate").reshape(n, c, -1)
    row = w + 2 * pad
    base = (torch.arange(h, device=x.device)[:, None] + pad) * row + (
        torch.arange(w, device=x.device)[None, :] + pad
    )
    base = base.view(1, h * w)
    shift = off_y * row + off_x  # (N, width): flat offset of each tap
    out = torch.zeros((n, c, h * w), dtype=x.dtype, device=x.device)
    for i in range(width):
        if weights[i] < 1e-6:  # beyond ~5 sigma: below half a grey level in total
            continue
        index = (base + shift[:, i : i + 1]).unsqueeze(1).expand(n, c, h * w)
        out.add_(torch.gather(padded, 2, index), alpha=weights[i])
    return out.view(n, c, h, w)


@lru_cache(maxsize=256)
def clipped_zoom_matrix(n: int, factor: float) -> Tensor:
    """The reference's ``clipped_zoom`` along one n-long axis, as an (n x n) matrix.

    Crop ``ch = ceil(n / factor)`` samples from ``(n - ch) // 2``, resize them to
    ``round(ch * factor)`` with scipy.ndimage.zoom (order 1: linear, end samples aligned),
    keep ``n`` samples from ``(len - n) // 2``. The integer crop makes the zoom centre drift
    by up to half a pixel towards the top-left; that is kept, as CIFAR-10-C has it.
    """
    crop = math.ceil(n / factor)
    top = (n - crop) // 2
    size = int(round(crop * factor))
    trim = (size - n) // 2
    outputs = torch.arange(trim, trim + n, dtype=torch.float64)
    position = outputs * ((crop - 1) / (size - 1) if size > 1 else 0.0)
    lower = position.floor().clamp(0, max(crop - 2, 0))
    frac = position - lower
    matrix = torch.zeros(n, n, dtype=torch.float64)
    rows = torch.arange(n)
    matrix[rows, top + lower.long()] += 1 - frac
    if crop > 1:
        matrix[rows, top + lower.long() + 1] += frac
    return matrix


def clipped_zoom(x: Tensor, factor: float) -> Tensor:
    h, w = x.shape[-2:]
    rows = clipped_zoom_matrix(h, float(factor)).to(x.device)
    cols = clipped_zoom_matrix(w, float(factor)).to(x.device)
    return separable(x, rows, cols)


def centre_zoom(x: Tensor, factor: float, padding_mode: str = "border") -> Tensor:
    """Zoom every image about its centre by ``factor`` (> 1 enlarges), output size kept.

    Bilinear; the batch and channels are folded together so one sampling grid serves all.
    """
    n, c, h, w = x.shape
    theta = torch.tensor(
        [[[1.0 / factor, 0.0, 0.0], [0.0, 1.0 / factor, 0.0]]], dtype=x.dtype, device=x.device
    )
    grid = F.affine_grid(theta, [1, n * c, h, w], align_corners=False)
    out = F.grid_sample(
        x.reshape(1, n * c, h, w), grid, mode="bilinear",
        padding_mode=padding_mode, align_corners=False,
    )  # fmt: skip
    return out.view(n, c, h, w)


def warp_pixels(x: Tensor, inverse: Tensor, padding_mode: str = "zeros") -> Tensor:
    """Warp the whole batch by one 3x3 homography given as output -> input pixel coordinates.

    Pixel coordinates put pixel centres at integers (0 .. W-1, 0 .. H-1); sampling is
    bilinear with ``padding_mode`` outside the image.
    """
    n, c, h, w = x.shape
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float64, device=x.device),
        torch.arange(w, dtype=torch.float64, device=x.device),
        indexing="ij",
    )
    points = torch.stack([xs, ys, torch.ones_like(xs)], dim=-1) @ inverse.to(x.device).T
    src_x, src_y = points[..., 0] / points[..., 2], points[..., 1] / points[..., 2]
    grid = torch.stack([(2 * src_x + 1) / w - 1, (2 * src_y + 1) / h - 1], dim=-1)
    out = F.grid_sample(
        x.reshape(1, n * c, h, w), grid[None].to(x.dtype), mode="bilinear",
        padding_mode=padding_mode, align_corners=False,
    )  # fmt: skip
    return out.view(n, c, h, w)


def sample_pixels(x: Tensor, src_y: Tensor, src_x: Tensor, padding_mode: str) -> Tensor:
    """Bilinear ``x`` at per-sample pixel coordinates ``src_y``, ``src_x`` of shape (N, H, W)."""
    h, w = x.shape[-2:]
    grid = torch.stack([(2 * src_x + 1) / w - 1, (2 * src_y + 1) / h - 1], dim=-1)
    return F.grid_sample(
        x, grid.to(x.dtype), mode="bilinear", padding_mode=padding_mode, align_corners=False
    )


def luminance(x: Tensor) -> Tensor:
    """Grey level (N, 1, H, W): the channel itself for grey images, ITU-R 601 luma for RGB."""
    if x.shape[1] == 1:
        return x
    weights = torch.tensor(LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True)


def colour(rgb: tuple[float, float, float], channels: int, like: Tensor) -> Tensor:
    """A colour as a (1, C, 1, 1) tensor: RGB as given, or its luma for grey images."""
    if channels == 1:
        value = sum(w * v for w, v in zip(LUMA, rgb, strict=True))
        return torch.tensor([value], dtype=like.dtype, device=like.device).view(1, 1, 1, 1)
    return torch.tensor(rgb, dtype=like.dtype, device=like.device).view(1, 3, 1, 1)


def plasma_fractal(
    n: int, size: int, wibble_decay: float, generator: torch.Generator, device: torch.device
) -> Tensor:
    """Diamond-square height maps (N, size, size) in [0, 1]; ``size`` a power of two.

    Batched transcription of the ``plasma_fractal`` in Hendrycks' ``make_cifar_c.py``
    (itself from FLHerne/mapgen): the same rolls, strides and ``wibble`` schedule, including
    its ``mean/4 + wibble * U(-wibble, wibble)`` update.
    """
    if size & (size - 1):
        raise ValueError(f"plasma_fractal needs a power-of-two size, got {size}")
    maps = torch.zeros(n, size, size, dtype=torch.float64, device=device)
    step, wibble = size, 100.0

    def wibbled_mean(total: Tensor) -> Tensor:
        noise = randomness.rand(total.shape, generator, device, torch.float64)
        return total / 4 + wibble * wibble * (2 * noise - 1)

    while step >= 2:
        half = step // 2
        corners = maps[:, 0::step, 0::step]
        squares = corners + torch.roll(corners, -1, dims=1)
        squares = squares + torch.roll(squares, -1, dims=2)
        maps[:, half::step, half::step] = wibbled_mean(squares)
        centres = maps[:, half::step, half::step]
        corners = maps[:, 0::step, 0::step]
        left = centres + torch.roll(centres, 1, dims=1) + corners + torch.roll(corners, -1, dims=2)
        maps[:, 0::step, half::step] = wibbled_mean(left)
        top = centres + torch.roll(centres, 1, dims=2) + corners + torch.roll(corners, -1, dims=1)
        maps[:, half::step, 0::step] = wibbled_mean(top)
        step //= 2
        wibble /= wibble_decay
    flat = maps.view(n, -1)
    flat = flat - flat.amin(1, keepdim=True)
    flat = flat / flat.amax(1, keepdim=True)
    return flat.view(n, size, size)


def next_power_of_two(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())
