"""Perturbation sequences in the style of CIFAR-10-P (Hendrycks & Dietterich, ICLR 2019).

``sequence(x, name, n_frames, seed)`` turns a batch (N, C, H, W) into (N, T, C, H, W):
frame 0 is the clean image (or, for ``gaussian_blur``, a sigma-0.3 blur of it), and later
frames move one step of the reference's per-frame schedule (``params.SEQ_*``) at a time.

Two kinds, as in the paper's flip probability:

- noise sequences (``NOISE_SEQUENCES``) are not temporally related: every frame t >= 1 is
  the clean image with fresh noise of one fixed strength, so a flip rate compares each frame
  with frame 0;
- all others change smoothly, so a flip rate compares consecutive frames.

The reference sweeps geometric and brightness parameters from -A to +A, which puts a
strongly perturbed image in frame 0. Here they start at the identity and move by the
reference's step per frame as a triangle wave 0 -> +A -> 0 -> -A -> 0 (``sweep``), so
frame 0 is clean and consecutive frames differ by exactly the reference's step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from aisafety import randomness
from aisafety.corruption import filters, params
from aisafety.corruption.base import check_images
from aisafety.corruption.digital import shift_value
from aisafety.corruption.noise import gaussian, poisson, speckle
from aisafety.errors import ConfigError, UnknownNameError

Tensor = torch.Tensor
SequenceFn = Callable[[Tensor, int, torch.Generator], list[Tensor]]


def sweep(t: int, schedule: params.Sweep) -> float:
    """Frame ``t`` of a triangle wave that starts at 0, moves ``step`` per frame and turns
    at +/- ``amplitude``."""
    m = round(schedule.amplitude / schedule.step)
    k = t % (4 * m)
    position = k if k <= m else (2 * m - k if k <= 3 * m else k - 4 * m)
    return position * schedule.step


def _noise_frames(x: Tensor, n_frames: int, draw: Callable[[], Tensor]) -> list[Tensor]:
    return [x] + [draw() for _ in range(n_frames - 1)]


def gaussian_noise(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    return _noise_frames(x, n_frames, lambda: gaussian(x, params.SEQ_GAUSSIAN_NOISE, gen))


def shot_noise(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    return _noise_frames(x, n_frames, lambda: poisson(x, params.SEQ_SHOT_NOISE, gen))


def speckle_noise(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    return _noise_frames(x, n_frames, lambda: speckle(x, params.SEQ_SPECKLE_NOISE, gen))


def gaussian_blur(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    start, step, truncate = params.SEQ_GAUSSIAN_BLUR
    return [filters.gaussian_blur(x, start + step * t, truncate) for t in range(n_frames)]


def zoom_blur(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    """Frame t: the mean of x and its centre zooms by 1 + 0.004 i, i = 1..t."""
    step = params.SEQ_ZOOM_BLUR
    total, frames = x.clone(), [x]
    for t in range(1, n_frames):
        total += filters.centre_zoom(x, 1.0 + step * t)
        frames.append(total / (t + 1))
    return frames


def _shift_columns(x: Tensor, shift: int) -> Tensor:
    """Move the content ``shift`` pixels right (left if negative), filling with zeros."""
    out = torch.zeros_like(x)
    if shift == 0:
        out.copy_(x)
    elif abs(shift) < x.shape[-1]:
        if shift > 0:
            out[..., shift:] = x[..., :-shift]
        else:
            out[..., :shift] = x[..., -shift:]
    return out


def translate(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    return [_shift_columns(x, round(sweep(t, params.SEQ_TRANSLATE))) for t in range(n_frames)]


def _about_centre(x: Tensor, inverse: Tensor) -> Tensor:
    """Warp with ``inverse`` (output -> input, 3x3) expressed about the image centre."""
    h, w = x.shape[-2:]
    cx, cy = (w - 1) / 2, (h - 1) / 2
    to_centre = torch.tensor([[1, 0, -cx], [0, 1, -cy], [0, 0, 1]], dtype=torch.float64)
    back = torch.tensor([[1, 0, cx], [0, 1, cy], [0, 0, 1]], dtype=torch.float64)
    return filters.warp_pixels(x, back @ inverse @ to_centre)


def _affine(a: float, b: float, c: float, d: float) -> Tensor:
    return torch.tensor([[a, b, 0], [c, d, 0], [0, 0, 1]], dtype=torch.float64)


def rotate(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    """Rotation about the centre, positive = counter-clockwise on screen (torchvision's)."""
    frames = []
    for t in range(n_frames):
        angle = math.radians(sweep(t, params.SEQ_ROTATE))
        cos, sin = math.cos(angle), math.sin(angle)
        frames.append(_about_centre(x, _affine(cos, -sin, sin, cos)))
    return frames


def scale(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    """Zoom about the centre by ``1 + sweep`` (zeros where a zoom-out uncovers the border)."""
    frames = []
    for t in range(n_frames):
        factor = 1.0 + sweep(t, params.SEQ_SCALE)
        frames.append(_about_centre(x, _affine(1 / factor, 0, 0, 1 / factor)))
    return frames


def shear(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    """Horizontal shear about the centre by the swept angle."""
    frames = []
    for t in range(n_frames):
        slope = math.tan(math.radians(sweep(t, params.SEQ_SHEAR)))
        frames.append(_about_centre(x, _affine(1, -slope, 0, 1)))
    return frames


def tilt_homography(h: int, w: int, degrees: float) -> Tensor:
    """The reference's perspective tilt (rotation by ``degrees`` about both image axes,
    viewed from distance f = sqrt(w^2 + h^2) with focal length f) as input -> output pixels.

    The reference puts the image plane at depth f + 1 (``P1`` maps to z = 1), which shrinks
    even an untilted image by f / (f + 1); here the plane is at depth f, so 0 degrees is the
    identity.
    """
    phi = theta = math.radians(degrees)
    f = math.sqrt(w * w + h * h)
    cx, cy = (w - 1) / 2, (h - 1) / 2
    p1 = torch.tensor([[1, 0, -cx], [0, 1, -cy], [0, 0, 0], [0, 0, 1]], dtype=torch.float64)
    c, s = math.cos(theta), math.sin(theta)
    rx = [[1, 0, 0, 0], [0, c, -s, 0], [0, s, c, 0], [0, 0, 0, 1]]
    c, s = math.cos(phi), math.sin(phi)
    ry = [[c, 0, -s, 0], [0, 1, 0, 0], [s, 0, c, 0], [0, 0, 0, 1]]
    move = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, f], [0, 0, 0, 1]]
    p2 = [[f, 0, cx, 0], [0, f, cy, 0], [0, 0, 1, 0]]
    p2, move, rx, ry = (torch.tensor(m, dtype=torch.float64) for m in (p2, move, rx, ry))
    return p2 @ move @ rx @ ry @ p1


def tilt(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    h, w = x.shape[-2:]
    frames = []
    for t in range(n_frames):
        forward = tilt_homography(h, w, sweep(t, params.SEQ_TILT))
        frames.append(filters.warp_pixels(x, torch.linalg.inv(forward)))
    return frames


def brightness(x: Tensor, n_frames: int, gen: torch.Generator) -> list[Tensor]:
    return [shift_value(x, sweep(t, params.SEQ_BRIGHTNESS)) for t in range(n_frames)]


SEQUENCES: dict[str, SequenceFn] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "speckle_noise": speckle_noise,
    "gaussian_blur": gaussian_blur,
    "zoom_blur": zoom_blur,
    "translate": translate,
    "rotate": rotate,
    "tilt": tilt,
    "scale": scale,
    "shear": shear,
    "brightness": brightness,
}
NOISE_SEQUENCES = frozenset({"gaussian_noise", "shot_noise", "speckle_noise"})


def sequence(x: Tensor, name: str, n_frames: int = 31, seed: int = 0) -> Tensor:
    """Frames (N, n_frames, C, H, W) in [0, 1] of perturbation sequence ``name``."""
    if name not in SEQUENCES:
        raise UnknownNameError("perturbation sequence", name, SEQUENCES)
    if isinstance(n_frames, bool) or int(n_frames) != n_frames or n_frames < 1:
        raise ConfigError(f"n_frames must be a positive integer, got {n_frames!r}")
    check_images(x, f"perturbation sequence {name!r}")
    generator = randomness.generator(seed)
    with torch.no_grad():
        frames = SEQUENCES[name](x.detach(), int(n_frames), generator)
        return torch.stack(frames, dim=1).clamp(0.0, 1.0).to(x.dtype)
