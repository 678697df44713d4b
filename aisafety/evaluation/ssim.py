"""Batched structural similarity (SSIM) in pure torch, matching scikit-image.

Why: the ASS metric (Average Structural Similarity, AISafety paper eq. 5) is the mean SSIM
between each clean image and its adversarial counterpart; it measures how imperceptible a
perturbation is. Computing it per sample with ``skimage.metrics.structural_similarity`` costs a
Python loop and a GPU->CPU copy per image; :func:`ssim` does the whole batch with a single
``avg_pool2d`` call, on whatever device the tensors live on, and returns one value per sample
(average the result to get ASS).

Convention matched (to 1e-5): ``skimage.metrics.structural_similarity`` with its defaults, i.e.
``gaussian_weights=False`` (a ``win_size`` x ``win_size`` uniform window, 7 by default),
``K1=0.01``, ``K2=0.03``, ``use_sample_covariance=True`` (variances and covariance scaled by
``NP / (NP - 1)`` with ``NP = win_size**2``), the given ``data_range`` (``C1 = (K1 * R)**2``,
``C2 = (K2 * R)**2``), and the SSIM map averaged over the *valid* region only: skimage crops
``(win_size - 1) // 2`` pixels from every border before taking the mean, which leaves exactly the
positions where the window lies wholly inside the image, i.e. an unpadded pooling. For colour
images skimage (``channel_axis=...``) averages the per-channel mean SSIM; every channel has the
same number of valid positions, so that is the mean over channels and positions together.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from aisafety.errors import ConfigError, InputError

__all__ = ["ssim"]

K1 = 0.01
K2 = 0.03


def ssim(
    x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0, win_size: int = 7
) -> torch.Tensor:
    """Per-sample SSIM between two batches of images, as scikit-image computes it by default.

    Args:
        x: clean images, shape ``(N, C, H, W)`` (``C`` = 1 for gray, 3 for colour).
        y: images to compare with ``x`` (e.g. adversarial examples), same shape as ``x``.
        data_range: the span of possible pixel values (``1.0`` for images in ``[0, 1]``,
            ``255.0`` for 8-bit values); must be positive.
        win_size: side of the uniform sliding window; odd, at least 3 and at most ``min(H, W)``.

    Returns:
        Tensor of shape ``(N,)`` on the inputs' device: the mean SSIM of each sample pair
        (averaged over channels for colour images). Computed in float64; returned as float64 if
        ``x`` is float64, otherwise float32.

    Raises:
        ValueError (``InputError``): inputs that are not 4-D, shapes that differ, a batch with
            no channels, or images smaller than the window.
        ValueError (``ConfigError``): an even, too small or non-integer ``win_size``, or a
            non-positive / non-finite ``data_range``.
    """
    _check_args(x, y, data_range, win_size)
    out_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    n, c = x.shape[:2]
    if n == 0:
        return torch.empty(0, dtype=out_dtype, device=x.device)

    xd = x.detach().to(torch.float64)
    yd = y.detach().to(xd.device, torch.float64)
    # One pooling call for the five local statistics: E[x], E[y], E[x^2], E[y^2], E[xy].
    stacked = torch.cat([xd, yd, xd * xd, yd * yd, xd * yd], dim=1)
    means = F.avg_pool2d(stacked, kernel_size=win_size, stride=1)  # valid region only
    ux, uy, uxx, uyy, uxy = means.split(c, dim=1)

    np_ = win_size * win_size
    cov_norm = np_ / (np_ - 1.0)  # use_sample_covariance=True
    vx = cov_norm * (uxx - ux * ux)
    vy = cov_norm * (uyy - uy * uy)
    vxy = cov_norm * (uxy - ux * uy)

    c1 = (K1 * float(data_range)) ** 2
    c2 = (K2 * float(data_range)) ** 2
    # Same grouping as skimage: ((2 ux uy + C1)(2 vxy + C2)) / ((ux^2 + uy^2 + C1)(vx + vy + C2)).
    num = (2.0 * ux * uy + c1) * (2.0 * vxy + c2)
    den = (ux * ux + uy * uy + c1) * (vx + vy + c2)
    ssim_map = num / den
    return ssim_map.mean(dim=(1, 2, 3)).to(out_dtype)


def _check_args(x: object, y: object, data_range: object, win_size: object) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise InputError(
            f"ssim expects two torch.Tensor batches, got {type(x).__name__} and "
            f"{type(y).__name__}; convert with torch.as_tensor(...)"
        )
    if x.dim() != 4 or y.dim() != 4:
        raise InputError(
            f"ssim expects 4-D batches (N, C, H, W), got shapes {tuple(x.shape)} and "
            f"{tuple(y.shape)}; add the missing axes, e.g. img[None, None] for one gray image"
        )
    if x.shape != y.shape:
        raise InputError(
            f"ssim needs x and y of the same shape, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if x.is_complex() or y.is_complex() or x.dtype == torch.bool or y.dtype == torch.bool:
        raise InputError(f"ssim needs real-valued images, got dtypes {x.dtype} and {y.dtype}")
    if isinstance(win_size, bool) or not isinstance(win_size, int):
        raise ConfigError(f"win_size must be an int, got {win_size!r}")
    if win_size < 3 or win_size % 2 == 0:
        raise ConfigError(
            f"win_size must be odd and at least 3 (as in skimage), got {win_size}; try 7"
        )
    if isinstance(data_range, bool) or not isinstance(data_range, (int, float)):
        raise ConfigError(f"data_range must be a number, got {data_range!r}")
    if not math.isfinite(data_range) or data_range <= 0:
        raise ConfigError(
            f"data_range must be positive and finite, got {data_range}; "
            "use 1.0 for images in [0, 1] or 255.0 for 8-bit values"
        )
    n, c, h, w = x.shape
    if c == 0:
        raise InputError(f"ssim got images with no channels, shape {tuple(x.shape)}")
    if h < win_size or w < win_size:
        raise InputError(
            f"images of size {h}x{w} are smaller than the {win_size}x{win_size} SSIM window; "
            f"pass a smaller odd win_size (at most {min(h, w)})"
        )
