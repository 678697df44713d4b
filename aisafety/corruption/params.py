"""Severity tables: one entry per severity 1..5, copied from the CIFAR-10-C generator.

Source: Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations" (ICLR 2019), reference code ``hendrycks/robustness``,
``ImageNet-C/create_c/make_cifar_c.py`` (commit ca360085). Pixel-valued parameters are the
32x32 CIFAR values and are used as given at every image size; the values the reference writes
as ``IMSIZE * f`` (elastic) are kept as the fraction ``f`` of the image's shorter side.
``docs/corruptions.md`` explains every table and every place where this port adapts it.

Perturbation-sequence schedules (CIFAR-10-P, ``ImageNet-P/create_p/make_cifar_p.py``) are at
the end.
"""

from __future__ import annotations

from typing import NamedTuple

# --- noise ----------------------------------------------------------------------------------

GAUSSIAN_NOISE = (0.04, 0.06, 0.08, 0.09, 0.10)  # sigma of N(0, sigma^2) added
SHOT_NOISE = (500, 250, 100, 75, 50)  # photons per unit intensity: Poisson(x * c) / c
IMPULSE_NOISE = (0.01, 0.02, 0.03, 0.05, 0.07)  # salt-and-pepper fraction of values
SPECKLE_NOISE = (0.06, 0.10, 0.12, 0.16, 0.20)  # sigma of x * N(0, sigma^2) added

# --- blur -----------------------------------------------------------------------------------

GAUSSIAN_BLUR = (0.4, 0.6, 0.7, 0.8, 1.0)  # sigma in pixels


class Defocus(NamedTuple):
    radius: float  # disk radius in pixels
    alias_blur: float  # sigma of the 3x3 Gaussian that anti-aliases the disk


DEFOCUS_BLUR = (
    Defocus(0.3, 0.4), Defocus(0.4, 0.5), Defocus(0.5, 0.6), Defocus(1.0, 0.2), Defocus(1.5, 0.1),
)  # fmt: skip


class Glass(NamedTuple):
    sigma: float  # Gaussian blur before and after the shuffle
    max_delta: int  # offsets are drawn from randint(-max_delta, max_delta), i.e. -d .. d-1
    iterations: int  # shuffle passes


GLASS_BLUR = (
    Glass(0.05, 1, 1), Glass(0.25, 1, 1), Glass(0.4, 1, 1), Glass(0.25, 1, 2), Glass(0.4, 1, 2),
)  # fmt: skip


class Motion(NamedTuple):
    radius: float  # ImageMagick motion-blur radius (kernel width 2 * ceil(radius) + 1)
    sigma: float  # ImageMagick motion-blur sigma


MOTION_BLUR = (Motion(6, 1), Motion(6, 1.5), Motion(6, 2), Motion(8, 2), Motion(9, 2.5))

# Where a pixel of the shuffled region takes its value from, as (dy, dx) offset and probability.
# The reference swaps pixels one by one in reverse raster order with offsets from
# randint(-1, 1) (i.e. -1 or 0): a swapped pixel can be carried on by later swaps, so values
# travel up to ~5 pixels. This table is the displacement distribution of that loop, measured
# by running it on an index image (1,500 random 40x40 fields, interior 24x24 pixels, offsets
# with probability >= 0.1% kept: 98.5% of the mass, renormalised at use). It holds for the
# table's max_delta = 1; docs/corruptions.md has the script.
GLASS_SHUFFLE = (
    ((-1, -1), 0.2541),
    ((-1, 0), 0.1908),
    ((0, -1), 0.1425),
    ((0, 0), 0.1067),
    ((0, 1), 0.0534),
    ((1, 0), 0.0469),
    ((1, 1), 0.0365),
    ((1, -1), 0.0268),
    ((1, 2), 0.0193),
    ((2, 1), 0.0171),
    ((2, 0), 0.0141),
    ((0, 2), 0.0133),
    ((2, 2), 0.0129),
    ((2, 3), 0.0074),
    ((1, 3), 0.0073),
    ((3, 2), 0.0063),
    ((3, 1), 0.0059),
    ((2, -1), 0.0050),
    ((3, 3), 0.0048),
    ((3, 0), 0.0036),
    ((0, 3), 0.0034),
    ((2, 4), 0.0033),
    ((3, 4), 0.0029),
    ((1, 4), 0.0025),
    ((4, 2), 0.0024),
    ((4, 3), 0.0024),
    ((4, 1), 0.0018),
    ((4, 4), 0.0018),
    ((3, 5), 0.0015),
    ((2, 5), 0.0013),
    ((4, 5), 0.0011),
    ((5, 3), 0.0011),
)

# np.arange(1, 1.06, 0.01) ... np.arange(1, 1.26, 0.01): 7, 12, 16, 21 and 26 zoom factors
# (floating-point arange includes the end point for severities 1 and 2; kept as the data has it).
ZOOM_BLUR = tuple(tuple(1.0 + 0.01 * i for i in range(n)) for n in (7, 12, 16, 21, 26))

# --- weather --------------------------------------------------------------------------------


class Snow(NamedTuple):
    mean: float  # snow layer ~ N(mean, std^2)
    std: float
    zoom: float  # centre zoom of the layer (larger flakes)
    threshold: float  # layer values below are set to 0
    blur_radius: float  # motion blur of the layer (ImageMagick radius, sigma)
    blur_sigma: float
    blend: float  # x <- blend * x + (1 - blend) * max(x, 1.5 * grey(x) + 0.5)


SNOW = (
    Snow(0.10, 0.2, 1.00, 0.60, 8, 3, 0.95),
    Snow(0.10, 0.2, 1.00, 0.50, 10, 4, 0.90),
    Snow(0.15, 0.3, 1.75, 0.55, 10, 4, 0.90),
    Snow(0.25, 0.3, 2.25, 0.60, 12, 6, 0.85),
    Snow(0.30, 0.3, 1.25, 0.65, 14, 12, 0.80),
)


class Frost(NamedTuple):
    image: float  # out = image * x + frost * texture
    frost: float


FROST = (Frost(1.0, 0.2), Frost(1.0, 0.3), Frost(0.9, 0.4), Frost(0.85, 0.4), Frost(0.75, 0.45))


class Fog(NamedTuple):
    strength: float  # weight of the plasma fractal added
    wibble_decay: float  # diamond-square roughness (larger: smoother fog)


FOG = (Fog(0.2, 3), Fog(0.5, 3), Fog(0.75, 2.5), Fog(1.0, 2), Fog(1.5, 1.75))


class Spatter(NamedTuple):
    mean: float  # liquid layer ~ N(mean, std^2), blurred with sigma, cut at threshold
    std: float
    sigma: float
    threshold: float
    intensity: float  # water: colour strength; mud: blur sigma of the mud mask
    mud: int  # 0: water drops (pale turquoise), 1: mud (brown)


SPATTER = (
    Spatter(0.62, 0.1, 0.7, 0.70, 0.5, 0),
    Spatter(0.65, 0.1, 0.8, 0.70, 0.5, 0),
    Spatter(0.65, 0.3, 1.0, 0.69, 0.5, 0),
    Spatter(0.65, 0.1, 0.7, 0.69, 0.6, 1),
    Spatter(0.65, 0.1, 0.5, 0.68, 0.6, 1),
)
WATER_RGB = (175 / 255, 238 / 255, 238 / 255)  # pale turquoise
MUD_RGB = (63 / 255, 42 / 255, 20 / 255)  # mud brown

# --- digital --------------------------------------------------------------------------------

BRIGHTNESS = (0.05, 0.10, 0.15, 0.20, 0.30)  # added to the HSV value channel
CONTRAST = (0.75, 0.50, 0.40, 0.30, 0.15)  # factor on the deviation from the channel mean


class Saturate(NamedTuple):
    scale: float  # HSV saturation s <- clip(s * scale + shift, 0, 1)
    shift: float


SATURATE = (
    Saturate(0.3, 0.0), Saturate(0.1, 0.0), Saturate(1.5, 0.0), Saturate(2.0, 0.1),
    Saturate(2.5, 0.2),
)  # fmt: skip
JPEG_QUALITY = (80, 65, 58, 50, 40)
PIXELATE = (0.95, 0.90, 0.85, 0.75, 0.65)  # down-scaling factor (BOX down, BOX up)


class Elastic(NamedTuple):
    alpha: float  # displacement amplitude, fraction of the shorter side (reference: x 32)
    sigma: float  # smoothing of the displacement field, fraction of the shorter side
    affine: float  # random affine: corner jitter, fraction of the shorter side


ELASTIC = (
    Elastic(0.00, 0.00, 0.08),
    Elastic(0.05, 0.20, 0.07),
    Elastic(0.08, 0.06, 0.06),
    Elastic(0.10, 0.04, 0.05),
    Elastic(0.10, 0.03, 0.03),
)

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
