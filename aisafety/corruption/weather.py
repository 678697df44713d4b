"""Weather corruptions: snow, frost, fog, spatter."""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from aisafety import randomness
from aisafety.corruption import filters, params
from aisafety.corruption.blur import uniform
from aisafety.corruption.params import SeverityTable

Tensor = torch.Tensor


def _randn(shape: tuple[int, ...], gen: torch.Generator, like: Tensor) -> Tensor:
    return randomness.randn(shape, gen, like.device, like.dtype)


def _fractal(like: Tensor, wibble_decay: float, gen: torch.Generator) -> Tensor:
    """A plasma fractal per image of ``like`` (N, 1, H, W): the top-left crop of a
    power-of-two map at least 32 wide (the reference uses a 32x32 map for 32x32 images)."""
    n, _, h, w = like.shape
    size = max(32, filters.next_power_of_two(max(h, w)))
    maps = filters.plasma_fractal(n, size, wibble_decay, gen, like.device)
    return maps[:, None, :h, :w].to(like.dtype)


def fog(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """``(x + c * fractal) * max(x) / (max(x) + c)``, the same fractal for every channel."""
    strength, wibble_decay = table.fog[severity - 1]
    peak = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + strength * _fractal(x, wibble_decay, gen)) * peak / (peak + strength)


def snow(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """Thresholded zoomed noise, motion-blurred at an angle ~ U(-135, -45) degrees, added
    twice (the layer and its 180-degree rotation) to a whitened image.

    The layer goes through ImageMagick as an 8-bit PNG in the reference: it is truncated to
    8 bits before the blur and rounded to 8 bits after it, as here."""
    p = table.snow[severity - 1]
    n, _, h, w = x.shape
    layer = p.mean + p.std * _randn((n, 1, h, w), gen, x)
    if p.zoom != 1:
        layer = filters.clipped_zoom(layer, p.zoom)
    layer = torch.floor(torch.where(layer < p.threshold, 0.0, layer).clamp(0, 1) * 255) / 255
    angle = uniform(n, -135.0, -45.0, gen, x.device)
    layer = filters.motion_blur(layer, p.blur_radius, p.blur_sigma, angle)
    layer = torch.round(layer * 255) / 255
    whitened = torch.maximum(x, filters.luminance(x) * 1.5 + 0.5)
    x = p.blend * x + (1 - p.blend) * whitened
    return x + layer + layer.flip(-1, -2)


FROST_PHOTOS = 5  # the reference draws randint(5): frost1..frost5; frost6.jpg is never used


@lru_cache(maxsize=8)
def frost_photo(index: int, scale: float) -> Tensor:
    """Frost photograph ``index`` (1..5) as uint8 (3, H, W), resized by ``scale`` as the
    reference does (OpenCV INTER_LINEAR, done once when the files were made; see
    ``frost/NOTICE``)."""
    tag = "full" if scale == 1.0 else f"x{scale:g}"
    name = f"frost{index}_{tag}.png"
    path = resources.files("aisafety.corruption").joinpath("frost", name)
    if not path.is_file():
        raise FileNotFoundError(f"frost photograph {name} is missing from aisafety/corruption")
    with path.open("rb") as handle:
        pixels = np.asarray(Image.open(handle).convert("RGB")).copy()
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def cover(photo: Tensor, h: int, w: int) -> Tensor:
    """A photograph smaller than the image, enlarged to cover it: imagecorruptions' rule
    (the larger of the two side ratios, times 1.1, bicubic); a large enough one as it is."""
    ph, pw = photo.shape[-2:]
    if ph >= h + 1 and pw >= w + 1:
        return photo
    factor = 1.1 * max(h / ph, w / pw, 1.0)
    size = (math.ceil(ph * factor), math.ceil(pw * factor))
    big = F.interpolate(photo[None].double(), size=size, mode="bicubic", align_corners=False)
    return big[0].round().clamp(0, 255).to(torch.uint8)


def frost_crops(n: int, h: int, w: int, scale: float, gen: torch.Generator, device) -> Tensor:
    """One random H x W crop of a random frost photograph per image, (N, 3, H, W) in [0, 1].

    As the reference: photograph ``randint(5)``, top-left corner ``randint(0, PH - H)``,
    ``randint(0, PW - W)`` (the last position is never drawn)."""
    photos = [cover(frost_photo(i + 1, scale), h, w).to(device) for i in range(FROST_PHOTOS)]
    which = randomness.randint(0, FROST_PHOTOS, (n,), gen, device)
    u = randomness.rand((n, 2), gen, device, torch.float64)
    out = torch.empty((n, 3, h, w), dtype=torch.float64, device=device)
    rows, cols = torch.arange(h, device=device), torch.arange(w, device=device)
    for i, photo in enumerate(photos):
        chosen = (which == i).nonzero().flatten()
        if len(chosen) == 0:
            continue
        top = (u[chosen, 0] * (photo.shape[1] - h)).long()
        left = (u[chosen, 1] * (photo.shape[2] - w)).long()
        r = (top[:, None] + rows)[:, :, None]  # (k, H, 1)
        c = (left[:, None] + cols)[:, None, :]  # (k, 1, W)
        out[chosen] = photo[:, r, c].permute(1, 0, 2, 3).double() / 255
    return out


def frost(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """``a * x + b * crop`` of one of the reference's frost photographs (its luma for grey
    images), the photographs resized by the table's ``frost_scale`` first."""
    image, weight = table.frost[severity - 1]
    n, c, h, w = x.shape
    crops = frost_crops(n, h, w, table.frost_scale, gen, x.device).to(x.dtype)
    if c == 1:
        crops = filters.luminance(crops)
    return image * x + weight * crops


TAN_22_5 = int(0.4142135623730950488 * (1 << 15) + 0.5)  # OpenCV's fixed-point tan(22.5)


def canny(levels: Tensor, low: float = 50, high: float = 150) -> Tensor:
    """OpenCV ``Canny(img, low, high)`` (3x3 Sobel, L1 magnitude) on 8-bit levels (N, 1, H, W).

    Sobel with replicated borders; non-maximum suppression along the gradient quantised to
    0/45/90/135 degrees with OpenCV's fixed-point tan(22.5) test and its strict/non-strict
    comparisons (zero magnitude outside the image); hysteresis grows the pixels above
    ``high`` through 8-connected pixels above ``low`` until nothing changes.
    """
    p = F.pad(levels, (1, 1, 1, 1), mode="replicate")
    dx = (p[..., :-2, 2:] + 2 * p[..., 1:-1, 2:] + p[..., 2:, 2:]) - (
        p[..., :-2, :-2] + 2 * p[..., 1:-1, :-2] + p[..., 2:, :-2]
    )
    dy = (p[..., 2:, :-2] + 2 * p[..., 2:, 1:-1] + p[..., 2:, 2:]) - (
        p[..., :-2, :-2] + 2 * p[..., :-2, 1:-1] + p[..., :-2, 2:]
    )
    mag = dx.abs() + dy.abs()
    m = F.pad(mag, (1, 1, 1, 1))

    def at(row: int, col: int) -> Tensor:  # neighbour at offset (row, col) in -1..1
        h, w = mag.shape[-2:]
        return m[..., 1 + row : 1 + row + h, 1 + col : 1 + col + w]

    ax, ay = dx.abs() * TAN_22_5, dy.abs() * (1 << 15)
    horizontal = ay < ax
    vertical = ay > ax + dx.abs() * (1 << 16)
    keep_h = (mag > at(0, -1)) & (mag >= at(0, 1))
    keep_v = (mag > at(-1, 0)) & (mag >= at(1, 0))
    same_sign = (dx < 0) == (dy < 0)
    keep_d = torch.where(
        same_sign, (mag > at(-1, -1)) & (mag > at(1, 1)), (mag > at(-1, 1)) & (mag > at(1, -1))
    )
    candidate = torch.where(horizontal, keep_h, torch.where(vertical, keep_v, keep_d))
    candidate = candidate & (mag > low)
    edges = candidate & (mag > high)
    active = torch.arange(len(edges), device=edges.device)  # images still growing
    while len(active):
        part = edges[active]
        grown = F.max_pool2d(part.to(levels.dtype), 3, stride=1, padding=1) > 0
        grown &= candidate[active]
        changed = (grown != part).flatten(1).any(1)
        edges[active] = grown
        active = active[changed]
    return edges


CHAMFER = (1.0, 1.4, 2.1969)  # OpenCV's DIST_L2 weights for its 5x5 mask


def _shifted(row: Tensor, k: int, fill: float) -> Tensor:
    """``out[:, j] = row[:, j + k]``, ``fill`` where ``j + k`` is off the row."""
    if k == 0:
        return row
    out = torch.full_like(row, fill)
    if k > 0:
        out[:, :-k] = row[:, k:]
    else:
        out[:, -k:] = row[:, :k]
    return out


def distance_to(edges: Tensor, cap: float) -> Tensor:
    """OpenCV ``distanceTransform(DIST_L2, 5)`` to the edge pixels, truncated at ``cap``.

    The two raster passes of the 5x5 chamfer transform (weights 1, 1.4, 2.1969), one row at
    a time for the whole batch: a row first takes what the two rows before it offer, then
    the along-row term ``min_i d[i] + (j - i)`` is a running minimum (``cummin``).
    No edge at all gives ``cap`` everywhere, as distanceTransform + THRESH_TRUNC does.
    """
    a, b, c = CHAMFER
    n, _, h, w = edges.shape
    big = float(2 * (h + w) + cap)
    rows = list(torch.where(edges[:, 0], 0.0, big).double().unbind(1))
    ramp = torch.arange(w, dtype=torch.float64, device=edges.device)

    def scan(row: Tensor, backward: bool) -> Tensor:
        if backward:
            row = row.flip(1)
        row = (row - a * ramp).cummin(1).values + a * ramp
        return row.flip(1) if backward else row

    for backward in (False, True):
        step = -1 if backward else 1
        order = range(h - 1, -1, -1) if backward else range(h)
        for i in order:
            row = rows[i]
            if 0 <= i - step < h:
                prev = rows[i - step]
                row = torch.minimum(row, prev + a)
                for k, weight in ((-1, b), (1, b), (-2, c), (2, c)):
                    row = torch.minimum(row, _shifted(prev, k, big) + weight)
            if 0 <= i - 2 * step < h:
                prev2 = rows[i - 2 * step]
                for k in (-1, 1):
                    row = torch.minimum(row, _shifted(prev2, k, big) + c)
            rows[i] = scan(row, backward)
    return torch.stack(rows, 1).clamp_max(cap)[:, None]


def equalize_hist(x: Tensor) -> Tensor:
    """OpenCV ``equalizeHist`` per image on integer levels 0..255 (N, 1, H, W)."""
    n = x.shape[0]
    levels = x.reshape(n, -1).long()
    total = levels.shape[1]
    hist = torch.zeros(n, 256, dtype=torch.float64, device=x.device)
    hist.scatter_add_(1, levels, torch.ones_like(levels, dtype=torch.float64))
    first = (hist > 0).float().argmax(1, keepdim=True)
    first_count = hist.gather(1, first)
    scale = 255.0 / (total - first_count).clamp_min(1)
    lut = torch.round((hist.cumsum(1) - first_count) * scale).clamp(0, 255)
    constant = first_count == total
    lut = torch.where(constant, first.double(), lut)
    return lut.gather(1, levels).view_as(x).to(x.dtype)


EMBOSS = torch.tensor([[-2.0, -1.0, 0.0], [-1.0, 1.0, 1.0], [0.0, 1.0, 2.0]])


def spatter(x: Tensor, severity: int, gen: torch.Generator, table: SeverityTable) -> Tensor:
    """Water drops (severities 1-3) or mud (4-5) from a thresholded, blurred noise layer."""
    p = table.spatter[severity - 1]
    n, c, h, w = x.shape
    liquid = p.mean + p.std * _randn((n, 1, h, w), gen, x)
    liquid = filters.gaussian_blur(liquid, p.sigma)
    liquid = torch.where(liquid < p.threshold, 0.0, liquid)
    if p.mud:
        mask = filters.gaussian_blur((liquid > p.threshold).to(x.dtype), p.intensity)
        mask = torch.where(mask < 0.8, 0.0, mask)
        return x * (1 - mask) + filters.colour(params.MUD_RGB, c, x) * mask
    levels = torch.floor(liquid.clamp(0, 1) * 255)
    dist = distance_to(canny(levels), cap=20.0).to(x.dtype)
    dist = torch.floor(filters.box_blur3(dist))
    dist = equalize_hist(dist)
    dist = torch.round(filters.filter2d(dist, EMBOSS, mode="reflect")).clamp(0, 255)
    dist = torch.round(filters.box_blur3(dist))
    shade = levels * dist
    peak = shade.amax(dim=(2, 3), keepdim=True)
    shade = torch.where(peak > 0, shade / peak.clamp_min(1e-12), 0.0) * p.intensity
    return x + shade * filters.colour(params.WATER_RGB, c, x)
