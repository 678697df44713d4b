"""Corruptions and perturbation sequences (Hendrycks & Dietterich 2019).

Besides the contract every corruption keeps (shape, dtype, range, determinism, distinct
severities), each transformation is checked against an independent reference: a closed form
(brightness, contrast, noise statistics), a library doing the same operation (skimage
Gaussian blur and HSV conversion, Pillow's BOX resize and JPEG, scipy's zoom, correlate,
map_coordinates and distance transform), or a plain-numpy transcription of the reference
code's loops (glass-blur shuffle, ImageMagick motion blur, plasma fractal).
"""

from __future__ import annotations

import io
import math
from itertools import pairwise

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage
from skimage import color
from skimage.filters import gaussian
from skimage.transform import warp

from aisafety.corruption import (
    CATEGORIES,
    CORRUPTIONS,
    NOISE_SEQUENCES,
    SEQUENCES,
    blur,
    corrupt,
    filters,
    params,
    sequence,
    weather,
)
from aisafety.corruption.blur import disk_kernel
from aisafety.corruption.digital import shift_value
from aisafety.corruption.sequences import sweep
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.errors import ConfigError, InputError, UnknownNameError

NAMES = list(CORRUPTIONS)
CIFAR = params.CIFAR10_C
SEVERITIES = (1, 2, 3, 4, 5)


@pytest.fixture(scope="module")
def mnist() -> torch.Tensor:
    return EmbeddedMnist().load(None, "test").x[::170].clone()  # ordered by class: spread out


@pytest.fixture(scope="module")
def rgb() -> torch.Tensor:
    """Smooth random colour images (bilinear upsampling of 6x6 noise), 32x32, float32."""
    gen = torch.Generator().manual_seed(7)
    small = torch.rand((4, 3, 6, 6), generator=gen)
    big = torch.nn.functional.interpolate(small, size=32, mode="bilinear", align_corners=False)
    return big.clamp(0, 1).contiguous()


def _hwc(x: torch.Tensor) -> np.ndarray:
    return x.permute(0, 2, 3, 1).double().numpy()


# --- the contract, for every corruption and severity ------------------------------------------


def test_registry_lists_the_19_corruptions():
    assert len(CORRUPTIONS) == 19
    assert sorted(n for group in CATEGORIES.values() for n in group) == sorted(CORRUPTIONS)


@pytest.mark.parametrize("name", NAMES)
def test_contract(name, mnist, rgb):
    odd = rgb[:2, :, :30, 1:]  # non-square, non-contiguous
    for images in (mnist, rgb, odd, rgb.double()[:1]):
        previous = None
        for severity in SEVERITIES:
            out = corrupt(images, name, severity, seed=3)
            assert out.shape == images.shape and out.dtype == images.dtype
            assert torch.isfinite(out).all()
            assert out.min() >= 0 and out.max() <= 1
            assert torch.equal(out, corrupt(images, name, severity, seed=3)), "not deterministic"
            # saturate on grey images: as the reference does on three equal channels,
            # severities 1-3 leave them unchanged (docs/corruptions.md)
            same = name == "saturate" and images.shape[1] == 1 and severity <= 3
            if previous is not None and not same:
                assert (out - previous).abs().max() > 1e-4, f"severity {severity} == {severity - 1}"
            previous = out


RANDOM = {
    "gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "glass_blur",
    "motion_blur", "snow", "frost", "fog", "spatter", "elastic_transform",
}  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_seed_changes_only_the_random_ones(name, rgb):
    a, b = corrupt(rgb, name, 3, seed=0), corrupt(rgb, name, 3, seed=1)
    assert torch.equal(a, b) is (name not in RANDOM)


# Where the reference's tables grow the corruption at every step, the distance from the clean
# image grows too (same seed). Not here: glass blur (severity 4 lowers sigma), elastic (the
# affine jitter shrinks with severity), snow, frost, spatter and saturate (their tables are
# not monotone), and motion blur, whose severities 3 and 4 share one sigma.
MONOTONE = [
    "gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "defocus_blur",
    "zoom_blur", "gaussian_blur", "fog", "brightness", "contrast", "jpeg_compression",
]  # fmt: skip


@pytest.mark.parametrize("name", MONOTONE)
def test_distance_from_clean_grows_with_severity(name, mnist, rgb):
    for images in (mnist, rgb):
        change = [(corrupt(images, name, s) - images).abs().mean().item() for s in SEVERITIES]
        assert all(b > a for a, b in pairwise(change)), change


def test_pixelate_grows_on_mnist(mnist):
    change = [(corrupt(mnist, "pixelate", s) - mnist).abs().mean().item() for s in SEVERITIES]
    assert all(b > a for a, b in pairwise(change)), change


def test_bad_inputs_are_named():
    x = torch.rand(2, 1, 28, 28)
    with pytest.raises(UnknownNameError, match="gausian_noise"):
        corrupt(x, "gausian_noise", 1)
    with pytest.raises(ConfigError, match="1..5"):
        corrupt(x, "fog", 6)
    with pytest.raises(InputError, match="C = 1 or 3"):
        corrupt(torch.rand(2, 2, 28, 28), "fog", 1)
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        corrupt(x * 2, "fog", 1)
    with pytest.raises(InputError, match="float"):
        corrupt((x * 255).to(torch.uint8), "fog", 1)


# --- hand-checkable cases and closed forms ---------------------------------------------------


@pytest.mark.parametrize("severity", SEVERITIES)
def test_brightness_of_constant_grey_is_value_plus_c(severity):
    c = CIFAR.brightness[severity - 1]
    for level in (0.0, 0.3, 0.9):
        for channels in (1, 3):
            x = torch.full((2, channels, 28, 28), level)
            expected = (x + c).clamp(0, 1)  # in the tensor's float32, as documented
            assert torch.equal(corrupt(x, "brightness", severity), expected)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_contrast_keeps_a_constant_image(severity):
    x = torch.full((2, 3, 32, 32), 0.37)
    torch.testing.assert_close(corrupt(x, "contrast", severity), x, atol=1e-6, rtol=0)


def test_contrast_formula(rgb):
    mean = rgb.mean(dim=(2, 3), keepdim=True)
    expected = ((rgb - mean) * CIFAR.contrast[1] + mean).clamp(0, 1)
    torch.testing.assert_close(corrupt(rgb, "contrast", 2), expected)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_noise_statistics_on_mid_grey(severity):
    x = torch.full((32, 3, 32, 32), 0.5)
    sigma = CIFAR.gaussian_noise[severity - 1]
    residual = corrupt(x, "gaussian_noise", severity) - x
    assert abs(residual.std().item() / sigma - 1) < 0.02 and abs(residual.mean()) < 2e-3
    photons = CIFAR.shot_noise[severity - 1]
    shot = corrupt(x, "shot_noise", severity)
    assert abs(shot.mean().item() - 0.5) < 2e-3
    assert abs(shot.var().item() / (0.5 / photons) - 1) < 0.03
    amount = CIFAR.impulse_noise[severity - 1]
    impulse = corrupt(x, "impulse_noise", severity)
    flipped = (impulse != x).float().mean().item()
    assert abs(flipped / amount - 1) < 0.1 and set(impulse.unique().tolist()) <= {0.0, 0.5, 1.0}
    speckle = corrupt(x, "speckle_noise", severity) - x
    assert abs(speckle.std().item() / (0.5 * CIFAR.speckle_noise[severity - 1]) - 1) < 0.02


def test_gaussian_blur_matches_skimage(rgb):
    for severity, sigma in enumerate(CIFAR.gaussian_blur, start=1):
        reference = np.stack([gaussian(im, sigma=sigma, channel_axis=-1) for im in _hwc(rgb)])
        ours = _hwc(corrupt(rgb.double(), "gaussian_blur", severity))
        np.testing.assert_allclose(ours, reference, atol=1e-12)


def _hsv_reference(images: np.ndarray, channel: int, scale: float, shift: float) -> np.ndarray:
    out = []
    for im in images:
        hsv = color.rgb2hsv(im)
        hsv[..., channel] = np.clip(hsv[..., channel] * scale + shift, 0, 1)
        out.append(np.clip(color.hsv2rgb(hsv), 0, 1))
    return np.stack(out)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_brightness_and_saturate_match_skimage_hsv(severity, rgb):
    x = rgb.double().clone()
    x[0, :, :4, :4] = 0.6  # grey pixels: hue 0 in skimage, so saturate tints them red
    x[0, :, 4:8, :4] = 0.0  # black
    ours = _hwc(corrupt(x, "brightness", severity))
    expected = _hsv_reference(_hwc(x), 2, 1.0, CIFAR.brightness[severity - 1])
    np.testing.assert_allclose(ours, expected, atol=1e-12)
    scale, shift = CIFAR.saturate[severity - 1]
    ours = _hwc(corrupt(x, "saturate", severity))
    np.testing.assert_allclose(ours, _hsv_reference(_hwc(x), 1, scale, shift), atol=1e-12)


def test_saturate_on_grey_images_is_the_luma_of_three_equal_channels(mnist):
    """A grey image is saturated as three equal channels (the reference's only input) and
    brought back to one channel as its luma: unchanged at severities 1-3, darkened by the
    red tint at 4-5."""
    rgb = mnist.expand(-1, 3, -1, -1).contiguous()
    for severity in SEVERITIES:
        expected = filters.luminance(corrupt(rgb, "saturate", severity))
        torch.testing.assert_close(corrupt(mnist, "saturate", severity), expected)
        if CIFAR.saturate[severity - 1].shift == 0:
            torch.testing.assert_close(corrupt(mnist, "saturate", severity), mnist)


def _pil_box(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    small = Image.fromarray(image.astype(np.float32), mode="F").resize(size, Image.BOX)
    return np.asarray(small.resize(image.shape[::-1], Image.BOX))


@pytest.mark.parametrize("severity", SEVERITIES)
def test_pixelate_matches_pillow_box_resize(severity, mnist):
    factor = CIFAR.pixelate[severity - 1]
    x = mnist[:, :, :, 2:]  # 28 x 26: both axes, different sizes
    ours = corrupt(x, "pixelate", severity)[:, 0].numpy()
    for image, out in zip(x[:, 0].numpy(), ours, strict=True):
        expected = _pil_box(image, (int(26 * factor), int(28 * factor)))
        np.testing.assert_allclose(out, np.clip(expected, 0, 1), atol=1e-6)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_pixelate_leaves_an_already_pixelated_image_unchanged(severity):
    """An image that is blockwise constant on the pixelation grid (Pillow's own BOX
    enlargement of a small image) comes back as it was. Exact at 28 and 32 pixels, where
    Pillow's BOX reduction undoes its enlargement; at some other sizes it does not quite."""
    factor = CIFAR.pixelate[severity - 1]
    rng = np.random.RandomState(severity)
    for h, w in ((28, 28), (32, 28)):
        small = rng.rand(int(h * factor), int(w * factor)).astype(np.float32)
        image = np.asarray(Image.fromarray(small, mode="F").resize((w, h), Image.BOX))
        x = torch.from_numpy(image.copy())[None, None]
        torch.testing.assert_close(corrupt(x, "pixelate", severity), x, atol=1e-6, rtol=0)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_jpeg_of_a_constant_image_is_unchanged(severity):
    for channels in (1, 3):
        x = torch.full((2, channels, 32, 32), 100 / 255)
        out = corrupt(x, "jpeg_compression", severity)
        torch.testing.assert_close(out, x, atol=1.5 / 255, rtol=0)


def test_jpeg_is_pillows_jpeg(rgb):
    quality = CIFAR.jpeg_compression[2]
    pixels = (rgb[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    expected = np.asarray(Image.open(buffer)) / 255
    ours = corrupt(rgb[:1], "jpeg_compression", 3)[0].permute(1, 2, 0).double().numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-6)


def _clipped_zoom(img: np.ndarray, factor: float) -> np.ndarray:
    """make_cifar_c.py's clipped_zoom, verbatim in behaviour."""
    h = img.shape[0]
    ch = int(np.ceil(h / factor))
    top = (h - ch) // 2
    img = ndimage.zoom(img[top : top + ch, top : top + ch], (factor, factor, 1), order=1)
    trim = (img.shape[0] - h) // 2
    return img[trim : trim + h, trim : trim + h]


@pytest.mark.parametrize("severity", SEVERITIES)
def test_zoom_blur_matches_the_reference(severity, rgb):
    factors = CIFAR.zoom_blur[severity - 1]
    expected = []
    for im in _hwc(rgb):
        total = np.zeros_like(im)
        for factor in factors:
            total += _clipped_zoom(im, factor)
        expected.append(np.clip((im + total) / (len(factors) + 1), 0, 1))
    ours = _hwc(corrupt(rgb.double(), "zoom_blur", severity))
    np.testing.assert_allclose(ours, np.stack(expected), atol=1e-12)


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """make_cifar_c.py's disk(): cv2.GaussianBlur(ksize=3) written as a 3-tap correlation."""
    taps = np.arange(-8, 9)
    xx, yy = np.meshgrid(taps, taps)
    disk = ((xx**2 + yy**2) <= radius**2).astype(np.float64)
    disk /= disk.sum()
    g = np.exp(-(np.arange(-1, 2) ** 2) / (2 * alias_blur**2))
    g /= g.sum()
    disk = ndimage.correlate1d(ndimage.correlate1d(disk, g, axis=0, mode="mirror"), g, axis=1)
    return disk


@pytest.mark.parametrize("severity", SEVERITIES)
def test_defocus_blur_matches_the_reference(severity, rgb):
    radius, alias_blur = CIFAR.defocus_blur[severity - 1]
    kernel = _disk(radius, alias_blur)
    ours = disk_kernel(radius, alias_blur).numpy()  # cropped to its support
    pad = (kernel.shape[0] - ours.shape[0]) // 2
    np.testing.assert_allclose(np.pad(ours, pad), kernel, atol=1e-12)
    expected = np.stack(
        [[ndimage.correlate(ch, kernel, mode="mirror") for ch in im] for im in rgb.double().numpy()]
    )
    ours = corrupt(rgb.double(), "defocus_blur", severity).numpy()
    np.testing.assert_allclose(ours, np.clip(expected, 0, 1), atol=1e-12)


def _imagemagick_motion_blur(image: np.ndarray, radius: float, sigma: float, angle: float):
    """MagickCore MotionBlurImage, pixel by pixel (edge virtual pixels)."""
    width = 2 * math.ceil(radius) + 1
    kernel = np.exp(-(np.arange(width) ** 2) / (2 * sigma * sigma))
    kernel /= kernel.sum()
    px, py = width * math.sin(math.radians(angle)), width * math.cos(math.radians(angle))
    ox = [math.ceil(i * py / math.hypot(px, py) - 0.5) for i in range(width)]
    oy = [math.ceil(i * px / math.hypot(px, py) - 0.5) for i in range(width)]
    c, h, w = image.shape
    out = np.zeros_like(image)
    for y in range(h):
        for x in range(w):
            for i in range(width):
                out[:, y, x] += kernel[i] * image[:, min(max(y + oy[i], 0), h - 1),
                                                  min(max(x + ox[i], 0), w - 1)]  # fmt: skip
    return out


def test_motion_blur_kernel_matches_imagemagick(rgb):
    angles = torch.tensor([-44.0, 0.0, 17.5, 40.0], dtype=torch.float64)
    ours = filters.motion_blur(rgb.double(), 6, 2, angles).numpy()
    for image, angle, out in zip(rgb.double().numpy(), angles.tolist(), ours, strict=True):
        np.testing.assert_allclose(out, _imagemagick_motion_blur(image, 6, 2, angle), atol=1e-6)


def test_glass_shuffle_is_the_reference_loop_on_views():
    """The reference's pixel "swap" on an H x W x 3 array, run as written (numpy views on
    both sides), fed the offsets ours draws: every pixel ends with the same value."""
    for delta, size in ((1, 12), (2, 14), (3, 17), (4, 20)):
        gen = torch.Generator().manual_seed(delta)
        offsets = torch.randint(-delta, delta, (1, 2, size, size), generator=gen)[0].numpy()
        image = np.arange(size * size * 3).reshape(size, size, 3)
        for row in range(size - delta, delta, -1):
            for col in range(size - delta, delta, -1):
                dx, dy = offsets[0, row, col], offsets[1, row, col]
                there = (row + dy, col + dx)
                image[row, col], image[there] = image[there], image[row, col]  # views
        source = blur.glass_sources(
            1, size, size, delta, torch.Generator().manual_seed(delta), "cpu"
        )
        np.testing.assert_array_equal(source[0].numpy(), image[..., 0].ravel() // 3)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_elastic_transform_matches_skimage_and_scipy(severity, rgb):
    """Same random numbers, drawn in the documented order; affine by skimage.warp (numpy
    'reflect' = OpenCV's BORDER_REFLECT_101), field by scipy map_coordinates."""
    x = rgb.double()
    n, _, h, w = x.shape
    gen = torch.Generator().manual_seed(0)
    jitter_u = torch.rand((n, 3, 2), generator=gen, dtype=torch.float64).numpy()
    field_u = torch.rand((n, 2, h, w), generator=gen, dtype=torch.float64).numpy()
    alpha, sigma, jitter = (v * min(h, w) for v in CIFAR.elastic_transform[severity - 1])
    s, cx, cy = min(h, w) // 3, w // 2, h // 2
    src = np.array([[cx + s, cy + s], [cx + s, cy - s], [cx - s, cy - s]], dtype=np.float64)
    ours = _hwc(corrupt(x, "elastic_transform", severity, seed=0))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    for i, image in enumerate(_hwc(x)):
        dst = src + jitter * (2 * jitter_u[i] - 1)
        forward = np.linalg.solve(np.c_[src, np.ones(3)], dst).T  # 2x3: src -> dst
        inverse = np.linalg.inv(np.vstack([forward, [0, 0, 1]]))

        def inverse_map(coords, inverse=inverse):
            return (np.c_[coords, np.ones(len(coords))] @ inverse.T)[:, :2]

        warped = warp(image, inverse_map, order=1, mode="reflect")
        field = [
            gaussian(2 * f - 1, sigma, mode="reflect", truncate=3) * alpha if sigma else 0 * f
            for f in field_u[i]
        ]
        expected = np.stack(
            [
                ndimage.map_coordinates(
                    warped[..., k], (yy + field[1], xx + field[0]), order=1, mode="reflect"
                )  # fmt: skip
                for k in range(3)
            ],
            -1,
        )
        np.testing.assert_allclose(ours[i], np.clip(expected, 0, 1), atol=1e-9)


def test_plasma_fractal_matches_the_reference_transcription():
    """The diamond-square code of make_cifar_c.py in numpy, fed the same uniform draws."""
    gen = torch.Generator().manual_seed(5)

    def uniform(low, high, shape):
        u = torch.rand(shape, generator=gen, dtype=torch.float64).numpy()
        return low + (high - low) * u

    size, decay = 32, 1.75
    grid = np.zeros((size, size))
    step, wibble = size, 100.0
    while step >= 2:
        half = step // 2
        corners = grid[0:size:step, 0:size:step]
        squares = corners + np.roll(corners, -1, axis=0)
        squares += np.roll(squares, -1, axis=1)
        grid[half:size:step, half:size:step] = squares / 4 + wibble * uniform(
            -wibble, wibble, squares.shape
        )
        dr, ul = grid[half:size:step, half:size:step], grid[0:size:step, 0:size:step]
        left = dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1)
        grid[0:size:step, half:size:step] = left / 4 + wibble * uniform(-wibble, wibble, left.shape)
        top = dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0)
        grid[half:size:step, 0:size:step] = top / 4 + wibble * uniform(-wibble, wibble, top.shape)
        step //= 2
        wibble /= decay
    grid = (grid - grid.min()) / (grid - grid.min()).max()
    ours = filters.plasma_fractal(1, size, decay, torch.Generator().manual_seed(5), "cpu")
    np.testing.assert_allclose(ours[0].numpy(), grid, atol=1e-12)


def test_fog_formula_and_spatter_pieces():
    x = torch.full((2, 1, 28, 28), 0.5)
    out = corrupt(x, "fog", 4)
    strength = CIFAR.fog[3].strength
    assert out.min() >= 0.5 * 0.5 / (0.5 + strength) - 1e-6  # x + c * [0, 1], scaled
    assert out.max() <= (0.5 + strength) * 0.5 / (0.5 + strength) + 1e-6
    # the 5x5 chamfer distance stays within 2% of the Euclidean one
    edges = torch.rand((3, 1, 30, 34), generator=torch.Generator().manual_seed(1)) < 0.01
    ours = weather.distance_to(edges, cap=1e9)[:, 0].numpy()
    exact = np.stack([ndimage.distance_transform_edt(~e) for e in edges[:, 0].numpy()])
    assert np.all(np.abs(ours - exact) <= 0.02 * exact + 1e-6)
    # histogram equalisation maps levels onto 0..255 by their cumulative counts
    levels = torch.tensor([[[[3.0, 3.0], [7.0, 9.0]]]])
    assert weather.equalize_hist(levels).flatten().tolist() == [0.0, 0.0, 128.0, 255.0]
    # Canny on a bright square marks its outline only
    square = torch.zeros((1, 1, 16, 16))
    square[..., 4:12, 4:12] = 200
    edges = weather.canny(square)[0, 0]
    assert edges.any() and not edges[6:10, 6:10].any() and not edges[:2].any()


def test_grey_images_are_three_equal_channels_brought_back_as_luma(mnist):
    """The reference takes RGB only: a grey image is corrupted as three equal channels and
    comes back as the luma of the result (the channel itself where they stayed equal)."""
    rgb = mnist.expand(-1, 3, -1, -1).contiguous()
    for name in NAMES:
        for severity in (1, 5):
            grey = corrupt(mnist, name, severity, seed=2)
            colour = corrupt(rgb, name, severity, seed=2)
            same = (colour[:, :1] == colour[:, 1:2]) & (colour[:, 1:2] == colour[:, 2:])
            expected = torch.where(same, colour[:, :1], filters.luminance(colour))
            assert torch.equal(grey, expected), name


# --- perturbation sequences ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_sequence_shape_and_first_frame(name, mnist, rgb):
    for images in (mnist[:3], rgb[:2]):
        frames = sequence(images, name, n_frames=9, seed=1)
        assert frames.shape == (images.shape[0], 9, *images.shape[1:])
        assert frames.dtype == images.dtype and frames.min() >= 0 and frames.max() <= 1
        assert torch.equal(frames, sequence(images, name, n_frames=9, seed=1))
        tolerance = 0.02 if name == "gaussian_blur" else 1e-5
        assert (frames[:, 0] - images).abs().max() <= tolerance
        steps = (frames[:, 1:] - frames[:, :-1]).abs().flatten(2).amax(2)
        assert (steps > 0).all(), "a frame repeats the previous one"


def test_translate_is_a_roll_in_the_interior(mnist):
    frames = sequence(mnist, "translate", n_frames=31)
    for t in range(31):
        shift = round(sweep(t, params.SEQ_TRANSLATE))
        rolled = torch.roll(mnist, shifts=shift, dims=-1)
        keep = slice(max(shift, 0), 28 + min(shift, 0))
        assert torch.equal(frames[:, t, ..., keep], rolled[..., keep])
        if shift:
            outside = slice(0, shift) if shift > 0 else slice(28 + shift, 28)
            assert (frames[:, t, ..., outside] == 0).all()


def test_sweeps_turn_at_the_amplitude_and_come_back():
    schedule = params.SEQ_ROTATE
    values = [sweep(t, schedule) for t in range(61)]
    assert values[:3] == [0.0, 1.0, 2.0] and values[15] == 15.0 and values[30] == 0.0
    assert values[45] == -15.0 and values[60] == 0.0
    assert max(abs(b - a) for a, b in pairwise(values)) == schedule.step


def test_geometric_sequences_return_to_the_clean_image(rgb):
    for name in ("rotate", "tilt", "shear", "scale"):
        frames = sequence(rgb, name, n_frames=31)  # frames 0 and 30 are both the identity
        torch.testing.assert_close(frames[:, 30], rgb, atol=1e-5, rtol=0)


def test_noise_sequences_are_fresh_noise_around_the_clean_image():
    x = torch.full((8, 3, 32, 32), 0.5)
    frames = sequence(x, "gaussian_noise", n_frames=6, seed=0)
    residual = frames[:, 1:] - x[:, None]
    assert abs(residual.std().item() / params.SEQ_GAUSSIAN_NOISE - 1) < 0.03
    correlation = torch.corrcoef(residual[:, :2].transpose(0, 1).reshape(2, -1))[0, 1]
    assert abs(correlation) < 0.05
    assert set(SEQUENCES) >= NOISE_SEQUENCES


def test_brightness_sequence_follows_the_sweep(rgb):
    frames = sequence(rgb, "brightness", n_frames=20)
    for t in (0, 7, 15, 19):
        expected = shift_value(rgb, sweep(t, params.SEQ_BRIGHTNESS)).clamp(0, 1)
        torch.testing.assert_close(frames[:, t], expected)


def test_sequence_errors():
    with pytest.raises(UnknownNameError):
        sequence(torch.rand(1, 1, 28, 28), "wobble")
    with pytest.raises(ConfigError):
        sequence(torch.rand(1, 1, 28, 28), "rotate", n_frames=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_the_device_contract(rgb):
    x = rgb.cuda()
    for name in NAMES:
        out = corrupt(x, name, 4, seed=1)
        assert out.device == x.device and out.shape == x.shape
        assert torch.equal(out, corrupt(x, name, 4, seed=1))
        if name not in RANDOM:  # no random draws: CPU and CUDA agree
            torch.testing.assert_close(out.cpu(), corrupt(rgb, name, 4), atol=1e-5, rtol=0)
    for name in SEQUENCES:
        assert sequence(x, name, n_frames=4).device == x.device
