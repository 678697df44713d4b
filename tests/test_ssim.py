"""The batched torch SSIM agrees with skimage.metrics.structural_similarity (defaults)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from aisafety.evaluation.ssim import ssim


def _noisy_pair(shape: tuple[int, ...], seed: int, sigma: float = 0.05):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=gen, dtype=torch.float32)
    y = (x + sigma * torch.randn(shape, generator=gen, dtype=torch.float32)).clamp(0.0, 1.0)
    return x, y


def _skimage_ssim(x: torch.Tensor, y: torch.Tensor, data_range=1.0, win_size=7) -> np.ndarray:
    """Reference: one skimage call per sample, on float64 arrays."""
    out = []
    for a, b in zip(x.double().numpy(), y.double().numpy(), strict=True):
        if a.shape[0] == 1:
            val = structural_similarity(a[0], b[0], data_range=data_range, win_size=win_size)
        else:
            val = structural_similarity(
                a, b, data_range=data_range, win_size=win_size, channel_axis=0
            )
        out.append(val)
    return np.asarray(out)


@pytest.mark.parametrize(
    ("shape", "seed"),
    [((8, 1, 28, 28), 0), ((6, 3, 32, 32), 1), ((4, 1, 20, 33), 2), ((3, 3, 17, 40), 3)],
    ids=["gray28", "colour32", "gray-nonsquare", "colour-nonsquare"],
)
def test_matches_skimage(shape, seed):
    x, y = _noisy_pair(shape, seed)
    got = ssim(x, y)
    assert got.shape == (shape[0],)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), _skimage_ssim(x, y), rtol=0, atol=1e-5)


@pytest.mark.parametrize("win_size", [3, 5, 11])
def test_matches_skimage_other_windows(win_size):
    x, y = _noisy_pair((4, 3, 24, 30), seed=10 + win_size, sigma=0.2)
    got = ssim(x, y, win_size=win_size)
    expected = _skimage_ssim(x, y, win_size=win_size)
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-5)


def test_matches_skimage_255_range():
    x, y = _noisy_pair((5, 1, 28, 28), seed=4, sigma=0.1)
    x, y = x * 255.0, y * 255.0
    got = ssim(x, y, data_range=255.0)
    expected = _skimage_ssim(x, y, data_range=255.0)
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-5)


def test_float64_in_float64_out():
    x, y = _noisy_pair((3, 3, 16, 16), seed=5)
    got = ssim(x.double(), y.double())
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), _skimage_ssim(x, y), rtol=0, atol=1e-12)


def test_identical_images_give_exactly_one():
    x, _ = _noisy_pair((5, 3, 32, 32), seed=6)
    assert torch.equal(ssim(x, x), torch.ones(5))
    g, _ = _noisy_pair((4, 1, 28, 28), seed=7)
    assert torch.equal(ssim(g, g.clone()), torch.ones(4))


def test_constant_images_hand_checked():
    # Constant images: both variances and the covariance are 0, so the contrast-structure term
    # is C2 / C2 = 1 and SSIM = (2ab + C1) / (a^2 + b^2 + C1) at every position.
    a, b = 0.25, 0.75  # dyadic, so every local mean is exact
    c1 = (0.01 * 1.0) ** 2
    expected = (2 * a * b + c1) / (a * a + b * b + c1)
    x = torch.full((2, 3, 9, 12), a, dtype=torch.float64)
    y = torch.full((2, 3, 9, 12), b, dtype=torch.float64)
    assert expected == 3751 / 6251  # (0.375 + 0.0001) / (0.625 + 0.0001)
    got = ssim(x, y)
    assert got.dtype == torch.float64
    # Exact up to float64 rounding (the map is a ratio of products and then averaged).
    assert got.tolist() == pytest.approx([expected, expected], rel=1e-15, abs=0)
    got32 = ssim(x.float(), y.float())
    assert got32.dtype == torch.float32
    assert got32.tolist() == pytest.approx([expected, expected], rel=1e-7, abs=0)


def test_samples_are_independent():
    x, y = _noisy_pair((4, 3, 20, 20), seed=8, sigma=0.1)
    batched = ssim(x, y)
    single = torch.cat([ssim(x[i : i + 1], y[i : i + 1]) for i in range(4)])
    assert torch.equal(batched, single)
    assert ssim(x[:0], y[:0]).shape == (0,)


def test_symmetric_and_below_one_for_different_images():
    x, y = _noisy_pair((4, 1, 28, 28), seed=9, sigma=0.1)
    torch.testing.assert_close(ssim(x, y), ssim(y, x), rtol=0, atol=1e-12)
    assert bool((ssim(x, y) < 1).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    x, y = _noisy_pair((4, 3, 32, 32), seed=11)
    got = ssim(x.cuda(), y.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), ssim(x, y), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "match"),
    [
        ((2, 1, 28, 28), (2, 1, 28, 27), "same shape"),
        ((2, 1, 28, 28), (3, 1, 28, 28), "same shape"),
        ((1, 28, 28), (1, 28, 28), "4-D"),
        ((2, 1, 1, 28, 28), (2, 1, 1, 28, 28), "4-D"),
        ((2, 1, 6, 28), (2, 1, 6, 28), "smaller than the 7x7"),
        ((2, 3, 28, 5), (2, 3, 28, 5), "smaller than the 7x7"),
        ((2, 0, 28, 28), (2, 0, 28, 28), "no channels"),
    ],
)
def test_bad_shapes_raise(x_shape, y_shape, match):
    with pytest.raises(ValueError, match=match):
        ssim(torch.zeros(x_shape), torch.zeros(y_shape))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"win_size": 6}, "odd"),
        ({"win_size": 1}, "at least 3"),
        ({"win_size": 7.0}, "int"),
        ({"data_range": 0.0}, "positive"),
        ({"data_range": -1.0}, "positive"),
        ({"data_range": float("nan")}, "finite"),
    ],
)
def test_bad_parameters_raise(kwargs, match):
    x = torch.zeros(2, 1, 28, 28)
    with pytest.raises(ValueError, match=match):
        ssim(x, x, **kwargs)


def test_non_tensor_raises():
    with pytest.raises(ValueError, match="torch.Tensor"):
        ssim(np.zeros((1, 1, 8, 8)), torch.zeros(1, 1, 8, 8))
