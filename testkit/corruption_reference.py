"""The reference corruptions of ``hendrycks/robustness`` (``ImageNet-C/create_c/``:
``make_cifar_c.py``, ``make_tinyimagenet_c.py``, ``make_imagenet_c.py``), for the tests and
bench/corruption_fidelity.py.

Each function does what the reference function does, step by step and with the same
libraries (numpy, scikit-image, scipy, OpenCV, Pillow, ImageMagick through Wand), the same
order of random draws from ``np.random`` and the same quirks: the glass-blur "swap" on numpy
views (a copy), ``np.uint8`` truncation, ``np.arange`` zoom factors (1.2500000000000002), the
frost crop that never takes the last position, ``randint(5)`` that never picks frost6.jpg.
Two things are generalised so one function serves all three scripts: the image side (the
scripts hard-code 32, 64 or 224) is read from the image, and the parameters come from
``TABLES`` (the scripts' ``c = [...]`` lists, copied number for number). Two library calls
changed names since the reference was written: ``gaussian(..., multichannel=True)`` is
``channel_axis=-1`` and ``np.float_`` is ``np.float64``.

Input: a PIL RGB image; output: float array (H, W, 3) in 0..255, before the ``np.uint8``
the reference applies when it stores the dataset.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import lru_cache
from io import BytesIO
from pathlib import Path

import cv2  # noqa: I001  (test extra: opencv, pulled in by imagecorruptions)
import numpy as np
import skimage as sk
from PIL import Image
from scipy.ndimage import map_coordinates
from scipy.ndimage import zoom as scizoom
from skimage.filters import gaussian

try:  # ImageMagick's MagickWand library: apt-get install libmagickwand-6.q16-6
    from wand.api import library as wandlibrary
    from wand.image import Image as WandImage

    wandlibrary.MagickMotionBlurImage.argtypes = (
        ctypes.c_void_p, ctypes.c_double, ctypes.c_double, ctypes.c_double,
    )  # fmt: skip
    HAVE_WAND = True
except (ImportError, AttributeError, OSError):
    HAVE_WAND = False

# The scripts' severity tables, one list of five per corruption, in their order.
CIFAR10_C = {
    "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],
    "shot_noise": [500, 250, 100, 75, 50],
    "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],
    "speckle_noise": [0.06, 0.1, 0.12, 0.16, 0.2],
    "gaussian_blur": [0.4, 0.6, 0.7, 0.8, 1],
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
    "zoom_blur": [(1.06, 0.01), (1.11, 0.01), (1.16, 0.01), (1.21, 0.01), (1.26, 0.01)],
    "fog": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
    "snow": [
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    ],
    "spatter": [
        (0.62, 0.1, 0.7, 0.7, 0.5, 0),
        (0.65, 0.1, 0.8, 0.7, 0.5, 0),
        (0.65, 0.3, 1, 0.69, 0.5, 0),
        (0.65, 0.1, 0.7, 0.69, 0.6, 1),
        (0.65, 0.1, 0.5, 0.68, 0.6, 1),
    ],
    "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],
    "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],
    "saturate": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],
    "jpeg_compression": [80, 65, 58, 50, 40],
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],
    "elastic_transform": [
        (32 * 0, 32 * 0, 32 * 0.08),
        (32 * 0.05, 32 * 0.2, 32 * 0.07),
        (32 * 0.08, 32 * 0.06, 32 * 0.06),
        (32 * 0.1, 32 * 0.04, 32 * 0.05),
        (32 * 0.1, 32 * 0.03, 32 * 0.03),
    ],
    "_frost_scale": 0.2,
    "_size": 32,
}

IMAGENET_C = {
    "gaussian_noise": [0.08, 0.12, 0.18, 0.26, 0.38],
    "shot_noise": [60, 25, 12, 5, 3],
    "impulse_noise": [0.03, 0.06, 0.09, 0.17, 0.27],
    "speckle_noise": [0.15, 0.2, 0.35, 0.45, 0.6],
    "gaussian_blur": [1, 2, 3, 4, 6],
    "glass_blur": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],
    "defocus_blur": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],
    "motion_blur": [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],
    "zoom_blur": [(1.11, 0.01), (1.16, 0.01), (1.21, 0.02), (1.26, 0.02), (1.31, 0.03)],
    "fog": [(1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)],
    "frost": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)],
    "snow": [
        (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
        (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
        (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
        (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
        (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
    ],
    "spatter": [
        (0.65, 0.3, 4, 0.69, 0.6, 0),
        (0.65, 0.3, 3, 0.68, 0.6, 0),
        (0.65, 0.3, 2, 0.68, 0.5, 0),
        (0.65, 0.3, 1, 0.65, 1.5, 1),
        (0.67, 0.4, 1, 0.65, 1.5, 1),
    ],
    "contrast": [0.4, 0.3, 0.2, 0.1, 0.05],
    "brightness": [0.1, 0.2, 0.3, 0.4, 0.5],
    "saturate": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)],
    "jpeg_compression": [25, 18, 15, 10, 7],
    "pixelate": [0.6, 0.5, 0.4, 0.3, 0.25],
    "elastic_transform": [
        (244 * 2, 244 * 0.7, 244 * 0.1),
        (244 * 2, 244 * 0.08, 244 * 0.2),
        (244 * 0.05, 244 * 0.01, 244 * 0.02),
        (244 * 0.07, 244 * 0.01, 244 * 0.02),
        (244 * 0.12, 244 * 0.01, 244 * 0.02),
    ],
    "_frost_scale": 1.0,
    "_size": 224,
}

TABLES = {"cifar10-c": CIFAR10_C, "imagenet-c": IMAGENET_C}


def frost_directory() -> Path:
    """The frost photographs as the ``imagecorruptions`` package ships them (found without
    importing it: its import needs ``pkg_resources``)."""
    spec = importlib.util.find_spec("imagecorruptions")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the frost photographs come with imagecorruptions (test extra)")
    return Path(spec.submodule_search_locations[0]) / "frost"


# --- helpers ---------------------------------------------------------------------------------


def disk(radius, alias_blur=0.1, dtype=np.float32):
    if radius <= 8:
        taps, ksize = np.arange(-8, 8 + 1), (3, 3)
    else:
        taps, ksize = np.arange(-radius, radius + 1), (5, 5)
    xx, yy = np.meshgrid(taps, taps)
    aliased = np.array((xx**2 + yy**2) <= radius**2, dtype=dtype)
    aliased /= np.sum(aliased)
    return cv2.GaussianBlur(aliased, ksize=ksize, sigmaX=alias_blur)


def motion_blur_png(image: Image.Image, radius: float, sigma: float, angle: float) -> np.ndarray:
    """ImageMagick's MotionBlurImage on a PNG of ``image``, decoded back by OpenCV."""
    buffer = BytesIO()
    image.save(buffer, format="PNG")
    with WandImage(blob=buffer.getvalue()) as wand_image:
        wandlibrary.MagickMotionBlurImage(wand_image.wand, radius, sigma, angle)
        blob = wand_image.make_blob()
    return cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_UNCHANGED)


def plasma_fractal(mapsize, wibbledecay):
    assert mapsize & (mapsize - 1) == 0
    maparray = np.empty((mapsize, mapsize), dtype=np.float64)
    maparray[0, 0] = 0
    stepsize = mapsize
    wibble = 100

    def wibbledmean(array):
        return array / 4 + wibble * np.random.uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        half = stepsize // 2
        corners = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        squares = corners + np.roll(corners, shift=-1, axis=0)
        squares += np.roll(squares, shift=-1, axis=1)
        maparray[half:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(squares)
        dr = maparray[half:mapsize:stepsize, half:mapsize:stepsize]
        ul = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        left = dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1)
        maparray[0:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(left)
        top = dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0)
        maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = wibbledmean(top)
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


def clipped_zoom(img, zoom_factor):
    h = img.shape[0]
    ch = int(np.ceil(h / zoom_factor))
    top = (h - ch) // 2
    img = scizoom(img[top : top + ch, top : top + ch], (zoom_factor, zoom_factor, 1), order=1)
    trim_top = (img.shape[0] - h) // 2
    return img[trim_top : trim_top + h, trim_top : trim_top + h]


# --- the corruptions -------------------------------------------------------------------------


def gaussian_noise(x, c, t):
    x = np.array(x) / 255.0
    return np.clip(x + np.random.normal(size=x.shape, scale=c), 0, 1) * 255


def shot_noise(x, c, t):
    x = np.array(x) / 255.0
    return np.clip(np.random.poisson(x * c) / c, 0, 1) * 255


def impulse_noise(x, c, t):
    # the reference leaves skimage's generator unseeded; seeded from np.random here so that
    # a test is repeatable (the same distribution)
    rng = np.random.randint(2**31)
    x = sk.util.random_noise(np.array(x) / 255.0, mode="s&p", amount=c, rng=rng)
    return np.clip(x, 0, 1) * 255


def speckle_noise(x, c, t):
    x = np.array(x) / 255.0
    return np.clip(x + x * np.random.normal(size=x.shape, scale=c), 0, 1) * 255


def gaussian_blur(x, c, t):
    x = gaussian(np.array(x) / 255.0, sigma=c, channel_axis=-1)
    return np.clip(x, 0, 1) * 255


def glass_blur(x, c, t):
    x = np.uint8(gaussian(np.array(x) / 255.0, sigma=c[0], channel_axis=-1) * 255)
    size_h, size_w = x.shape[:2]
    for _ in range(c[2]):
        for h in range(size_h - c[1], c[1], -1):
            for w in range(size_w - c[1], c[1], -1):
                dx, dy = np.random.randint(-c[1], c[1], size=(2,))
                h_prime, w_prime = h + dy, w + dx
                x[h, w], x[h_prime, w_prime] = x[h_prime, w_prime], x[h, w]  # views: a copy
    return np.clip(gaussian(x / 255.0, sigma=c[0], channel_axis=-1), 0, 1) * 255


def defocus_blur(x, c, t):
    x = np.array(x) / 255.0
    kernel = disk(radius=c[0], alias_blur=c[1])
    channels = np.array([cv2.filter2D(x[:, :, d], -1, kernel) for d in range(3)])
    return np.clip(channels.transpose((1, 2, 0)), 0, 1) * 255


def motion_blur(x, c, t):
    x = motion_blur_png(x, c[0], c[1], np.random.uniform(-45, 45))
    if x.ndim == 3:
        return np.clip(x[..., [2, 1, 0]], 0, 255)
    return np.clip(np.array([x, x, x]).transpose((1, 2, 0)), 0, 255)


def zoom_blur(x, c, t):
    factors = np.arange(1, c[0], c[1])
    x = (np.array(x) / 255.0).astype(np.float32)
    out = np.zeros_like(x)
    for zoom_factor in factors:
        out += clipped_zoom(x, zoom_factor)
    x = (x + out) / (len(factors) + 1)
    return np.clip(x, 0, 1) * 255


def fog(x, c, t):
    x = np.array(x) / 255.0
    h, w = x.shape[:2]
    max_val = x.max()
    mapsize = max(32, 1 << (max(h, w) - 1).bit_length())  # the scripts: 32, 64, 256
    x += c[0] * plasma_fractal(mapsize, c[1])[:h, :w][..., np.newaxis]
    return np.clip(x * max_val / (max_val + c[0]), 0, 1) * 255


@lru_cache(maxsize=16)
def frost_photo(idx: int, scale: float) -> np.ndarray:
    """Read (and resize) once: the same arrays the reference builds on every call."""
    names = ["frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg"]
    photo = cv2.imread(str(frost_directory() / names[idx]))
    if scale != 1.0:
        photo = cv2.resize(photo, (0, 0), fx=scale, fy=scale)
    photo.flags.writeable = False
    return photo


def frost(x, c, t):
    h, w = np.array(x).shape[:2]
    idx = np.random.randint(5)
    photo = frost_photo(idx, t["_frost_scale"])
    x_start = np.random.randint(0, photo.shape[0] - h)
    y_start = np.random.randint(0, photo.shape[1] - w)
    photo = photo[x_start : x_start + h, y_start : y_start + w][..., [2, 1, 0]]
    return np.clip(c[0] * np.array(x) + c[1] * photo, 0, 255)


def snow(x, c, t):
    x = np.array(x, dtype=np.float32) / 255.0
    h, w = x.shape[:2]
    layer = np.random.normal(size=x.shape[:2], loc=c[0], scale=c[1])
    layer = clipped_zoom(layer[..., np.newaxis], c[2])
    layer[layer < c[3]] = 0
    layer = Image.fromarray((np.clip(layer.squeeze(), 0, 1) * 255).astype(np.uint8), mode="L")
    layer = motion_blur_png(layer, c[4], c[5], np.random.uniform(-135, -45)) / 255.0
    layer = layer[..., np.newaxis]
    grey = cv2.cvtColor(x, cv2.COLOR_RGB2GRAY).reshape(h, w, 1)
    x = c[6] * x + (1 - c[6]) * np.maximum(x, grey * 1.5 + 0.5)
    return np.clip(x + layer + np.rot90(layer, k=2), 0, 1) * 255


def spatter(x, c, t):
    x = np.array(x, dtype=np.float32) / 255.0
    liquid = np.random.normal(size=x.shape[:2], loc=c[0], scale=c[1])
    liquid = gaussian(liquid, sigma=c[2])
    liquid[liquid < c[3]] = 0
    if c[5] == 0:
        liquid = (liquid * 255).astype(np.uint8)
        dist = 255 - cv2.Canny(liquid, 50, 150)
        dist = cv2.distanceTransform(dist, cv2.DIST_L2, 5)
        _, dist = cv2.threshold(dist, 20, 20, cv2.THRESH_TRUNC)
        dist = cv2.blur(dist, (3, 3)).astype(np.uint8)
        dist = cv2.equalizeHist(dist)
        ker = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]])
        dist = cv2.filter2D(dist, cv2.CV_8U, ker)
        dist = cv2.blur(dist, (3, 3)).astype(np.float32)
        m = cv2.cvtColor(liquid * dist, cv2.COLOR_GRAY2BGRA)
        m /= np.max(m, axis=(0, 1))
        m *= c[4]
        ones = np.ones_like(m[..., :1])
        color = np.concatenate((175 / 255.0 * ones, 238 / 255.0 * ones, 238 / 255.0 * ones), 2)
        color = cv2.cvtColor(color, cv2.COLOR_BGR2BGRA)
        x = cv2.cvtColor(x, cv2.COLOR_BGR2BGRA)
        return cv2.cvtColor(np.clip(x + m * color, 0, 1), cv2.COLOR_BGRA2BGR) * 255
    m = np.where(liquid > c[3], 1, 0)
    m = gaussian(m.astype(np.float32), sigma=c[4])
    m[m < 0.8] = 0
    ones = np.ones_like(x[..., :1])
    color = np.concatenate((63 / 255.0 * ones, 42 / 255.0 * ones, 20 / 255.0 * ones), axis=2)
    color *= m[..., np.newaxis]
    x *= 1 - m[..., np.newaxis]
    return np.clip(x + color, 0, 1) * 255


def contrast(x, c, t):
    x = np.array(x) / 255.0
    means = np.mean(x, axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255


def brightness(x, c, t):
    x = sk.color.rgb2hsv(np.array(x) / 255.0)
    x[:, :, 2] = np.clip(x[:, :, 2] + c, 0, 1)
    return np.clip(sk.color.hsv2rgb(x), 0, 1) * 255


def saturate(x, c, t):
    x = sk.color.rgb2hsv(np.array(x) / 255.0)
    x[:, :, 1] = np.clip(x[:, :, 1] * c[0] + c[1], 0, 1)
    return np.clip(sk.color.hsv2rgb(x), 0, 1) * 255


def jpeg_compression(x, c, t):
    output = BytesIO()
    x.save(output, "JPEG", quality=c)
    return np.asarray(Image.open(output), dtype=np.float64)


def pixelate(x, c, t):
    w, h = x.size
    x = x.resize((int(w * c), int(h * c)), Image.BOX)
    return np.asarray(x.resize((w, h), Image.BOX), dtype=np.float64)


def elastic_transform(image, c, t):
    scale = min(np.array(image).shape[:2]) / t["_size"]  # the table's pixels at this size
    c = [v * scale for v in c]
    image = np.array(image, dtype=np.float32) / 255.0
    shape = image.shape
    shape_size = shape[:2]
    center_square = np.float32(shape_size) // 2
    square_size = min(shape_size) // 3
    pts1 = np.float32(
        [
            center_square + square_size,
            [center_square[0] + square_size, center_square[1] - square_size],
            center_square - square_size,
        ]
    )
    pts2 = pts1 + np.random.uniform(-c[2], c[2], size=pts1.shape).astype(np.float32)
    matrix = cv2.getAffineTransform(pts1, pts2)
    image = cv2.warpAffine(image, matrix, shape_size[::-1], borderMode=cv2.BORDER_REFLECT_101)
    dx = (
        gaussian(np.random.uniform(-1, 1, size=shape[:2]), c[1], mode="reflect", truncate=3) * c[0]
    ).astype(np.float32)
    dy = (
        gaussian(np.random.uniform(-1, 1, size=shape[:2]), c[1], mode="reflect", truncate=3) * c[0]
    ).astype(np.float32)
    dx, dy = dx[..., np.newaxis], dy[..., np.newaxis]
    x, y, z = np.meshgrid(np.arange(shape[1]), np.arange(shape[0]), np.arange(shape[2]))
    indices = np.reshape(y + dy, (-1, 1)), np.reshape(x + dx, (-1, 1)), np.reshape(z, (-1, 1))
    out = map_coordinates(image, indices, order=1, mode="reflect").reshape(shape)
    return np.clip(out, 0, 1) * 255


FUNCTIONS = {
    f.__name__: f
    for f in (
        gaussian_noise, shot_noise, impulse_noise, speckle_noise, gaussian_blur, glass_blur,
        defocus_blur, motion_blur, zoom_blur, fog, frost, snow, spatter, contrast, brightness,
        saturate, jpeg_compression, pixelate, elastic_transform,
    )
}  # fmt: skip
NEEDS_WAND = {"motion_blur", "snow"}


def reference(name: str, images: np.ndarray, severity: int, table: str, seed: int = 0):
    """The reference corruption of uint8 images (N, H, W, 3): float (N, H, W, 3) in 0..255."""
    np.random.seed(seed)
    t = TABLES[table]
    c = t[name][severity - 1]
    return np.stack([FUNCTIONS[name](Image.fromarray(im), c, t) for im in images])
