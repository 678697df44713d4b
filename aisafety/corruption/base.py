"""The corruption registry and ``corrupt``, the one entry point to all 19 corruptions.

Every corruption is a function ``f(x, severity, generator, table) -> Tensor`` on a batch
(N, C, H, W) in [0, 1] that draws all its randomness from ``generator`` (a host
``torch.Generator``, drawn through ``aisafety.randomness`` so a seed gives the same noise on
every device) and reads its parameters from ``table`` (one of
the reference's three severity tables); ``corrupt`` validates, picks the table, seeds, and
clamps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from aisafety import randomness
from aisafety.corruption import blur, digital, filters, noise, weather
from aisafety.corruption.params import TABLES, SeverityTable, table_for_size
from aisafety.errors import ConfigError, InputError, UnknownNameError

Tensor = torch.Tensor
CorruptionFn = Callable[[Tensor, int, torch.Generator, SeverityTable], Tensor]

# Hendrycks & Dietterich's four groups of 15 (ImageNet-C) plus the four held-out
# "validation" corruptions (speckle noise, Gaussian blur, spatter, saturate).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise"),
    "blur": ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur"),
    "weather": ("snow", "frost", "fog", "brightness"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression"),
    "extra": ("speckle_noise", "gaussian_blur", "spatter", "saturate"),
}

CORRUPTIONS: dict[str, CorruptionFn] = {
    "gaussian_noise": noise.gaussian_noise,
    "shot_noise": noise.shot_noise,
    "impulse_noise": noise.impulse_noise,
    "defocus_blur": blur.defocus_blur,
    "glass_blur": blur.glass_blur,
    "motion_blur": blur.motion_blur,
    "zoom_blur": blur.zoom_blur,
    "snow": weather.snow,
    "frost": weather.frost,
    "fog": weather.fog,
    "brightness": digital.brightness,
    "contrast": digital.contrast,
    "elastic_transform": digital.elastic_transform,
    "pixelate": digital.pixelate,
    "jpeg_compression": digital.jpeg_compression,
    "speckle_noise": noise.speckle_noise,
    "gaussian_blur": blur.gaussian_blur,
    "spatter": weather.spatter,
    "saturate": digital.saturate,
}
SEVERITIES = (1, 2, 3, 4, 5)


def check_images(x: Tensor, who: str) -> None:
    """Reject what the corruptions cannot treat: not a float (N, C, H, W) batch in [0, 1]
    with one or three channels."""
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{who} takes a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise InputError(
            f"{who} takes images of shape (N, C, H, W) with C = 1 or 3, got {tuple(x.shape)};"
            " add the batch dimension or convert the images to grey or RGB"
        )
    if not x.is_floating_point():
        raise InputError(f"{who} takes float images in [0, 1], got {x.dtype}; use x.float() / 255")
    if x.numel():
        lo, hi = torch.aminmax(x.detach())
        if not (lo >= 0 and hi <= 1):
            raise InputError(
                f"{who} takes images in [0, 1], got values in [{lo.item():.3g}, {hi.item():.3g}]"
            )


def check_severity(severity: int) -> int:
    if isinstance(severity, bool) or int(severity) != severity or severity not in SEVERITIES:
        raise ConfigError(f"corruption severity must be an integer 1..5, got {severity!r}")
    return int(severity)


def resolve_table(table: str, height: int, width: int) -> SeverityTable:
    """The severity table named ``table``; ``auto`` picks the one made for the nearest image
    size (``params.table_for_size``)."""
    if table == "auto":
        return table_for_size(height, width)
    if table not in TABLES:
        raise UnknownNameError("severity table", table, ["auto", *TABLES])
    return TABLES[table]


def corrupt(x: Tensor, name: str, severity: int, seed: int = 0, table: str = "auto") -> Tensor:
    """Corrupt a batch (N, C, H, W) in [0, 1] with ``name`` at ``severity`` (1..5).

    ``table``: ``cifar10-c``, ``tiny-imagenet-c``, ``imagenet-c``, or ``auto`` (by image
    size: up to 45 px CIFAR-10-C, up to 119 px Tiny-ImageNet-C, else ImageNet-C). A grey
    image (C = 1) is corrupted as three equal channels and returned as the luma
    (``grey_level``), as the reference would treat a grey photograph.
    Deterministic for a given batch, seed and device; the result has the input's shape,
    dtype and device and lies in [0, 1]. No gradient flows through it.
    """
    if name not in CORRUPTIONS:
        raise UnknownNameError("corruption", name, CORRUPTIONS)
    severity = check_severity(severity)
    check_images(x, f"corruption {name!r}")
    chosen = resolve_table(table, *x.shape[-2:])
    if x.numel() == 0:
        return x.detach().clone()
    generator = randomness.generator(seed)
    grey = x.shape[1] == 1
    with torch.no_grad():
        images = x.detach().expand(-1, 3, -1, -1).contiguous() if grey else x.detach()
        out = CORRUPTIONS[name](images, severity, generator, chosen).clamp(0.0, 1.0)
        if grey:
            out = grey_level(out)
    return out.to(x.dtype)


def grey_level(rgb: Tensor) -> Tensor:
    """One channel back from a corrupted grey image: the reference only takes RGB, so a grey
    image goes through it as three equal channels and comes back as the ITU-R 601 luma of the
    (clipped) result; where the three channels stayed equal, that channel itself, exactly."""
    same = (rgb[:, :1] == rgb[:, 1:2]) & (rgb[:, 1:2] == rgb[:, 2:3])
    return torch.where(same, rgb[:, :1], filters.luminance(rgb))
