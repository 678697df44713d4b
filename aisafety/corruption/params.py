"""Severity tables: one entry per severity 1..5, for each of the reference's three datasets.

Source: Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations" (ICLR 2019), reference code ``hendrycks/robustness``,
``ImageNet-C/create_c/``: ``make_cifar_c.py`` (commit ca360085, 32x32 images),
``make_tinyimagenet_c.py`` (commit 7a64e6a1, 64x64) and ``make_imagenet_c.py`` (commit
e0377d46, 224x224). Pixel-valued parameters are used as given at every image size; the values
the reference writes as ``IMSIZE * f`` (elastic) are kept as fractions of the image's shorter
side. ``docs/corruptions.md`` explains every table and every place where this port adapts it.

Perturbation-sequence schedules (CIFAR-10-P, ``ImageNet-P/create_p/make_cifar_p.py``) are at
the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Defocus(NamedTuple):
    radius: float  # disk radius in pixels
    alias_blur: float  # sigma of the Gaussian (3x3; 5x5 past radius 8) that anti-aliases it


class Glass(NamedTuple):
    sigma: float  # Gaussian blur before and after the shuffle
    max_delta: int  # offsets are drawn from randint(-max_delta, max_delta), i.e. -d .. d-1
    iterations: int  # shuffle passes


class Motion(NamedTuple):
    radius: float  # ImageMagick motion-blur radius (kernel width 2 * ceil(radius) + 1)
    sigma: float  # ImageMagick motion-blur sigma


class Snow(NamedTuple):
    mean: float  # snow layer ~ N(mean, std^2)
    std: float
    zoom: float  # centre zoom of the layer (larger flakes)
    threshold: float  # layer values below are set to 0
    blur_radius: float  # motion blur of the layer (ImageMagick radius, sigma)
    blur_sigma: float
    blend: float  # x <- blend * x + (1 - blend) * max(x, 1.5 * grey(x) + 0.5)


class Frost(NamedTuple):
    image: float  # out = image * x + frost * (crop of a frost photograph)
    frost: float


class Fog(NamedTuple):
    strength: float  # weight of the plasma fractal added
    wibble_decay: float  # diamond-square roughness (larger: smoother fog)


class Spatter(NamedTuple):
    mean: float  # liquid layer ~ N(mean, std^2), blurred with sigma, cut at threshold
    std: float
    sigma: float
    threshold: float
    intensity: float  # water: colour strength; mud: blur sigma of the mud mask
    mud: int  # 0: water drops (pale turquoise), 1: mud (brown)


class Saturate(NamedTuple):
    scale: float  # HSV saturation s <- clip(s * scale + shift, 0, 1)
    shift: float


class Elastic(NamedTuple):
    alpha: float  # displacement amplitude, fraction of the shorter side (reference: x IMSIZE)
    sigma: float  # smoothing of the displacement field, fraction of the shorter side
    affine: float  # random affine: corner jitter, fraction of the shorter side


WATER_RGB = (175 / 255, 238 / 255, 238 / 255)  # pale turquoise
MUD_RGB = (63 / 255, 42 / 255, 20 / 255)  # mud brown


def zooms(stop: float, step: float) -> tuple[float, ...]:
    """``np.arange(1, stop, step)`` exactly as the reference computes it: numpy fills
    ``1 + i * ((1 + step) - 1)``, so 1.25 comes out as 1.2500000000000002 and scipy then sizes
    that zoom layer one pixel smaller (``round(26 * 1.2500000000000002) = 33`` vs a crop of
    ``ceil(32 / 1.25) = 26``: the layer a 32-pixel image gets differs)."""
    return tuple(float(f) for f in np.arange(1, stop, step))


@dataclass(frozen=True)
class SeverityTable:
    """All 19 corruptions' parameters for severities 1..5, as one reference script has them."""

    name: str
    size: int  # the image side the reference generates at
    gaussian_noise: tuple[float, ...]  # sigma of N(0, sigma^2) added
    shot_noise: tuple[float, ...]  # photons per unit intensity: Poisson(x * c) / c
    impulse_noise: tuple[float, ...]  # salt-and-pepper fraction of values
    speckle_noise: tuple[float, ...]  # sigma of x * N(0, sigma^2) added
    gaussian_blur: tuple[float, ...]  # sigma in pixels
    defocus_blur: tuple[Defocus, ...]
    glass_blur: tuple[Glass, ...]
    motion_blur: tuple[Motion, ...]
    zoom_blur: tuple[tuple[float, ...], ...]  # zoom factors averaged with the image
    snow: tuple[Snow, ...]
    frost: tuple[Frost, ...]
    frost_scale: float  # the photographs are resized by this factor before the crop
    fog: tuple[Fog, ...]
    spatter: tuple[Spatter, ...]
    brightness: tuple[float, ...]  # added to the HSV value channel
    contrast: tuple[float, ...]  # factor on the deviation from the channel mean
    saturate: tuple[Saturate, ...]
    jpeg_compression: tuple[int, ...]  # JPEG quality
    pixelate: tuple[float, ...]  # down-scaling factor (BOX down, BOX up)
    elastic_transform: tuple[Elastic, ...]


def _elastic(size: float, rows: list[tuple[float, float, float]]) -> tuple[Elastic, ...]:
    """The reference's (alpha, sigma, affine) in pixels at ``size`` as fractions of it."""
    return tuple(Elastic(*(v / size for v in row)) for row in rows)


CIFAR10_C = SeverityTable(
    name="cifar10-c",
    size=32,
    gaussian_noise=(0.04, 0.06, 0.08, 0.09, 0.10),
    shot_noise=(500, 250, 100, 75, 50),
    impulse_noise=(0.01, 0.02, 0.03, 0.05, 0.07),
    speckle_noise=(0.06, 0.10, 0.12, 0.16, 0.20),
    gaussian_blur=(0.4, 0.6, 0.7, 0.8, 1.0),
    defocus_blur=(Defocus(0.3, 0.4), Defocus(0.4, 0.5), Defocus(0.5, 0.6), Defocus(1, 0.2),
                  Defocus(1.5, 0.1)),
    glass_blur=(Glass(0.05, 1, 1), Glass(0.25, 1, 1), Glass(0.4, 1, 1), Glass(0.25, 1, 2),
                Glass(0.4, 1, 2)),
    motion_blur=(Motion(6, 1), Motion(6, 1.5), Motion(6, 2), Motion(8, 2), Motion(9, 2.5)),
    zoom_blur=(zooms(1.06, 0.01), zooms(1.11, 0.01), zooms(1.16, 0.01), zooms(1.21, 0.01),
               zooms(1.26, 0.01)),
    snow=(Snow(0.10, 0.2, 1.00, 0.60, 8, 3, 0.95), Snow(0.10, 0.2, 1.00, 0.50, 10, 4, 0.90),
          Snow(0.15, 0.3, 1.75, 0.55, 10, 4, 0.90), Snow(0.25, 0.3, 2.25, 0.60, 12, 6, 0.85),
          Snow(0.30, 0.3, 1.25, 0.65, 14, 12, 0.80)),
    frost=(Frost(1.0, 0.2), Frost(1.0, 0.3), Frost(0.9, 0.4), Frost(0.85, 0.4),
           Frost(0.75, 0.45)),
    frost_scale=0.2,
    fog=(Fog(0.2, 3), Fog(0.5, 3), Fog(0.75, 2.5), Fog(1.0, 2), Fog(1.5, 1.75)),
    spatter=(Spatter(0.62, 0.1, 0.7, 0.70, 0.5, 0), Spatter(0.65, 0.1, 0.8, 0.70, 0.5, 0),
             Spatter(0.65, 0.3, 1.0, 0.69, 0.5, 0), Spatter(0.65, 0.1, 0.7, 0.69, 0.6, 1),
             Spatter(0.65, 0.1, 0.5, 0.68, 0.6, 1)),
    brightness=(0.05, 0.10, 0.15, 0.20, 0.30),
    contrast=(0.75, 0.50, 0.40, 0.30, 0.15),
    saturate=(Saturate(0.3, 0.0), Saturate(0.1, 0.0), Saturate(1.5, 0.0), Saturate(2.0, 0.1),
              Saturate(2.5, 0.2)),
    jpeg_compression=(80, 65, 58, 50, 40),
    pixelate=(0.95, 0.90, 0.85, 0.75, 0.65),
    elastic_transform=_elastic(32, [(0, 0, 32 * 0.08), (32 * 0.05, 32 * 0.2, 32 * 0.07),
                                    (32 * 0.08, 32 * 0.06, 32 * 0.06),
                                    (32 * 0.1, 32 * 0.04, 32 * 0.05),
                                    (32 * 0.1, 32 * 0.03, 32 * 0.03)]),
)  # fmt: skip

TINY_IMAGENET_C = SeverityTable(
    name="tiny-imagenet-c",
    size=64,
    gaussian_noise=(0.04, 0.08, 0.12, 0.15, 0.18),
    shot_noise=(250, 100, 50, 30, 15),
    impulse_noise=(0.01, 0.02, 0.05, 0.08, 0.14),
    speckle_noise=(0.15, 0.2, 0.25, 0.3, 0.35),
    gaussian_blur=(0.5, 0.75, 1.0, 1.25, 1.5),
    defocus_blur=(Defocus(0.5, 0.6), Defocus(1, 0.1), Defocus(1.5, 0.1), Defocus(2.5, 0.01),
                  Defocus(3, 0.1)),
    glass_blur=(Glass(0.1, 1, 1), Glass(0.5, 1, 1), Glass(0.6, 1, 2), Glass(0.7, 2, 1),
                Glass(0.9, 2, 2)),
    motion_blur=(Motion(10, 1), Motion(10, 1.5), Motion(10, 2), Motion(10, 2.5), Motion(12, 3)),
    zoom_blur=(zooms(1.06, 0.01), zooms(1.11, 0.01), zooms(1.16, 0.01), zooms(1.21, 0.01),
               zooms(1.26, 0.01)),
    snow=(Snow(0.10, 0.2, 1.00, 0.60, 8, 3, 0.8), Snow(0.10, 0.2, 1.00, 0.50, 10, 4, 0.8),
          Snow(0.15, 0.3, 1.75, 0.55, 10, 4, 0.7), Snow(0.25, 0.3, 2.25, 0.60, 12, 6, 0.65),
          Snow(0.30, 0.3, 1.25, 0.65, 14, 12, 0.6)),
    frost=(Frost(1.0, 0.3), Frost(0.9, 0.4), Frost(0.8, 0.45), Frost(0.75, 0.5),
           Frost(0.7, 0.55)),
    frost_scale=0.3,
    fog=(Fog(0.4, 3), Fog(0.7, 3), Fog(1.0, 2.5), Fog(1.5, 2), Fog(2.0, 1.75)),
    spatter=(Spatter(0.62, 0.1, 0.7, 0.70, 0.6, 0), Spatter(0.65, 0.1, 0.8, 0.70, 0.6, 0),
             Spatter(0.65, 0.3, 1.0, 0.69, 0.6, 0), Spatter(0.65, 0.1, 0.7, 0.68, 0.6, 1),
             Spatter(0.65, 0.1, 0.5, 0.67, 0.6, 1)),
    brightness=(0.1, 0.2, 0.3, 0.4, 0.5),
    contrast=(0.4, 0.3, 0.2, 0.1, 0.05),
    saturate=(Saturate(0.3, 0.0), Saturate(0.1, 0.0), Saturate(2.0, 0.0), Saturate(5.0, 0.1),
              Saturate(30.0, 0.2)),
    jpeg_compression=(65, 58, 50, 40, 25),
    pixelate=(0.9, 0.8, 0.7, 0.6, 0.5),
    elastic_transform=_elastic(64, [(0, 0, 64 * 0.08), (64 * 0.05, 64 * 0.3, 64 * 0.06),
                                    (64 * 0.1, 64 * 0.08, 64 * 0.06),
                                    (64 * 0.1, 64 * 0.03, 64 * 0.03),
                                    (64 * 0.16, 64 * 0.03, 64 * 0.02)]),
)  # fmt: skip

IMAGENET_C = SeverityTable(
    name="imagenet-c",
    size=224,
    gaussian_noise=(0.08, 0.12, 0.18, 0.26, 0.38),
    shot_noise=(60, 25, 12, 5, 3),
    impulse_noise=(0.03, 0.06, 0.09, 0.17, 0.27),
    speckle_noise=(0.15, 0.2, 0.35, 0.45, 0.6),
    gaussian_blur=(1, 2, 3, 4, 6),
    defocus_blur=(Defocus(3, 0.1), Defocus(4, 0.5), Defocus(6, 0.5), Defocus(8, 0.5),
                  Defocus(10, 0.5)),
    glass_blur=(Glass(0.7, 1, 2), Glass(0.9, 2, 1), Glass(1, 2, 3), Glass(1.1, 3, 2),
                Glass(1.5, 4, 2)),
    motion_blur=(Motion(10, 3), Motion(15, 5), Motion(15, 8), Motion(15, 12), Motion(20, 15)),
    zoom_blur=(zooms(1.11, 0.01), zooms(1.16, 0.01), zooms(1.21, 0.02), zooms(1.26, 0.02),
               zooms(1.31, 0.03)),
    snow=(Snow(0.1, 0.3, 3, 0.5, 10, 4, 0.8), Snow(0.2, 0.3, 2, 0.5, 12, 4, 0.7),
          Snow(0.55, 0.3, 4, 0.9, 12, 8, 0.7), Snow(0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
          Snow(0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)),
    frost=(Frost(1, 0.4), Frost(0.8, 0.6), Frost(0.7, 0.7), Frost(0.65, 0.7), Frost(0.6, 0.75)),
    frost_scale=1.0,
    fog=(Fog(1.5, 2), Fog(2.0, 2), Fog(2.5, 1.7), Fog(2.5, 1.5), Fog(3.0, 1.4)),
    spatter=(Spatter(0.65, 0.3, 4, 0.69, 0.6, 0), Spatter(0.65, 0.3, 3, 0.68, 0.6, 0),
             Spatter(0.65, 0.3, 2, 0.68, 0.5, 0), Spatter(0.65, 0.3, 1, 0.65, 1.5, 1),
             Spatter(0.67, 0.4, 1, 0.65, 1.5, 1)),
    brightness=(0.1, 0.2, 0.3, 0.4, 0.5),
    contrast=(0.4, 0.3, 0.2, 0.1, 0.05),
    saturate=(Saturate(0.3, 0), Saturate(0.1, 0), Saturate(2, 0), Saturate(5, 0.1),
              Saturate(20, 0.2)),
    jpeg_compression=(25, 18, 15, 10, 7),
    pixelate=(0.6, 0.5, 0.4, 0.3, 0.25),
    # The reference writes 244 * f for its 224-pixel images ("244 should have been 224");
    # kept: at 224 pixels these are exactly its pixel values.
    elastic_transform=_elastic(224, [(244 * 2, 244 * 0.7, 244 * 0.1),
                                     (244 * 2, 244 * 0.08, 244 * 0.2),
                                     (244 * 0.05, 244 * 0.01, 244 * 0.02),
                                     (244 * 0.07, 244 * 0.01, 244 * 0.02),
                                     (244 * 0.12, 244 * 0.01, 244 * 0.02)]),
)  # fmt: skip

TABLES: dict[str, SeverityTable] = {t.name: t for t in (CIFAR10_C, TINY_IMAGENET_C, IMAGENET_C)}
TABLE_NAMES = ("auto", *TABLES)


def table_for_size(height: int, width: int) -> SeverityTable:
    """The default table for an image size: the reference dataset whose side is nearest on a
    log scale (CIFAR-10-C up to 45 px, Tiny-ImageNet-C up to 119 px, ImageNet-C above)."""
    side = min(height, width)
    return min(TABLES.values(), key=lambda t: abs(np.log(side / t.size)))


# --- perturbation sequences (CIFAR-10-P) ----------------------------------------------------


class Sweep(NamedTuple):
    """A parameter that moves by ``step`` per frame and turns at +/- ``amplitude``."""

    step: float
    amplitude: float


SEQ_GAUSSIAN_NOISE = 0.02  # sigma, fresh noise each frame (reference: 0.02 for CIFAR-10-P)
SEQ_SHOT_NOISE = 700  # Poisson(x * c) / c (reference validation set: 700, 400, 200)
SEQ_SPECKLE_NOISE = 0.05  # sigma of the multiplicative noise (reference: 0.05, 0.07, 0.1)
SEQ_GAUSSIAN_BLUR = (0.3, 0.015, 7.0)  # sigma = 0.3 + 0.015 * t, truncate 7
SEQ_ZOOM_BLUR = 0.004  # frame t averages zooms 1, 1.004, ..., 1 + 0.004 t
SEQ_TRANSLATE = Sweep(1, 7)  # pixels (reference: -7 .. 8)
SEQ_ROTATE = Sweep(1.0, 15.0)  # degrees (reference: -15 .. 15)
SEQ_TILT = Sweep(0.75, 11.25)  # degrees about both axes (reference: -11.25 .. 11.25)
SEQ_SCALE = Sweep(0.02, 0.30)  # zoom factor - 1 (reference: 0.70 .. 1.30)
SEQ_SHEAR = Sweep(1.0, 15.0)  # degrees (reference: -15 .. 15)
SEQ_BRIGHTNESS = Sweep(0.015, 0.225)  # HSV value shift (reference: -0.225 .. 0.225)
