"""IBP's boxes hold the exact (rational) range of each op over its input box.

Computed to nearest, ``mid - spread`` can be a few ulps above the exact minimum: on
resnet_4b's first convolution 6,311 of 8,192 lower ends were (docs/certification.md). Here
the exact range is computed with ``fractions.Fraction`` from the same float64 numbers.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from aisafety.verification.ops import Add, Conv, Dense, Elementwise, PositiveLinear


def _box(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes with centres of mixed magnitude (offsets make ``mid - spread`` round)."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 0.7
    radius = torch.rand(shape, generator=g, dtype=torch.float64) * 0.02
    return centre - radius, centre + radius


def _dense_range(w, bias, lo, hi) -> list[tuple[Fraction, Fraction]]:
    """Exact [min, max] of ``w x + bias`` over [lo, hi], one row per output (one sample)."""
    out = []
    for row, b in zip(w.tolist(), bias.tolist(), strict=True):
        low = high = Fraction(b)
        for wi, li, hi_ in zip(row, lo.tolist(), hi.tolist(), strict=True):
            p, q = Fraction(wi) * Fraction(li), Fraction(wi) * Fraction(hi_)
            low, high = low + min(p, q), high + max(p, q)
        out.append((low, high))
    return out


def _assert_holds(box, exact: list[tuple[Fraction, Fraction]]) -> None:
    lo, hi = (t.flatten().tolist() for t in box)
    below = sum(Fraction(a) > e[0] for a, e in zip(lo, exact, strict=True))
    above = sum(Fraction(a) < e[1] for a, e in zip(hi, exact, strict=True))
    assert below == 0 and above == 0, f"{below} lower / {above} upper ends inside the range"


@pytest.mark.parametrize("seed", range(3))
def test_a_dense_box_holds_the_exact_range(seed):
    g = torch.Generator().manual_seed(100 + seed)
    w = torch.randn(24, 40, generator=g, dtype=torch.float64)
    bias = torch.randn(24, generator=g, dtype=torch.float64) * 5
    op = Dense("fc", [0], (24,), weight=w, bias=bias)
    lo, hi = _box((1, 40), seed)
    _assert_holds(op.interval((lo, hi)), _dense_range(w, bias, lo[0], hi[0]))


@pytest.mark.parametrize("seed", range(3))
def test_a_convolution_box_holds_the_exact_range(seed):
    """A conv is a dense map: its exact range from the matrix the conv applies."""
    g = torch.Generator().manual_seed(200 + seed)
    w = torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(4, generator=g, dtype=torch.float64)
    op = Conv("conv", [0], (4, 3, 3), weight=w, bias=bias, stride=(2, 2), padding=(1, 1),
              in_shape=(3, 6, 6))  # fmt: skip
    lo, hi = _box((1, 3, 6, 6), seed)
    eye = torch.eye(108, dtype=torch.float64).reshape(108, 3, 6, 6)
    matrix = F.conv2d(eye, w, None, 2, 1).reshape(108, -1).T  # exact: one product per entry
    exact = _dense_range(matrix, bias.repeat_interleave(9), lo.flatten(), hi.flatten())
    _assert_holds(op.interval((lo, hi)), exact)


def _q(t: torch.Tensor) -> list[Fraction]:
    return [Fraction(v) for v in t.flatten().tolist()]


def test_an_elementwise_box_holds_the_exact_range():
    lo, hi = _box((1, 2, 4, 4), 7)
    g = torch.Generator().manual_seed(7)
    scale = torch.randn(2, 4, 4, generator=g, dtype=torch.float64) * 0.3
    shift = torch.randn(2, 4, 4, generator=g, dtype=torch.float64) * 9
    norm = Elementwise("norm", [0], (2, 4, 4), scale=scale, shift=shift)
    ends = [
        (a * s + t, b * s + t)
        for a, b, s, t in zip(_q(lo), _q(hi), _q(scale), _q(shift), strict=True)
    ]
    _assert_holds(norm.interval((lo, hi)), [(min(e), max(e)) for e in ends])


def test_an_addition_box_holds_the_exact_range():
    (lo, hi), second = _box((1, 2, 4, 4), 7), _box((1, 2, 4, 4), 8)
    add = Add("add", [0, 1], (2, 4, 4))
    sums = [(a + c, b + d) for a, b, c, d in zip(_q(lo), _q(hi), *map(_q, second), strict=True)]
    _assert_holds(add.interval((lo, hi), second), sums)


def test_an_average_pooling_box_holds_the_exact_range():
    lo, hi = _box((1, 2, 4, 4), 7)
    pool = PositiveLinear("pool", [0], (2, 2, 2), fn=lambda x: F.avg_pool2d(x, 2))
    windows = [(c, 2 * i, 2 * j) for c in range(2) for i in range(2) for j in range(2)]
    means = [
        tuple(sum(_q(t[0, c, i : i + 2, j : j + 2])) / 4 for t in (lo, hi)) for c, i, j in windows
    ]
    _assert_holds(pool.interval((lo, hi)), means)


def test_the_margin_is_a_few_ulps_and_float32_boxes_keep_none():
    """Float32 graphs are training graphs (``margins.py``): their boxes stay as computed."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(24, 40, generator=g, dtype=torch.float64)
    op = Dense("fc", [0], (24,), weight=w, bias=torch.zeros(24, dtype=torch.float64))
    box = _box((1, 40), 3)
    lo, hi = op.interval(box)
    mid, spread = F.linear((box[0] + box[1]) / 2, w), F.linear((box[1] - box[0]) / 2, w.abs())
    assert bool((lo < mid - spread).all()) and bool((hi > mid + spread).all())
    size = (box[1].abs().maximum(box[0].abs()) @ w.abs().T).flatten()
    assert float(((mid - spread - lo).flatten() / size).max()) < 2 * 46 * 2.0**-53 * 1.01
    op.to(torch.float32)
    small = tuple(t.float() for t in box)
    mid, spread = (
        F.linear((small[0] + small[1]) / 2, op.weight),
        F.linear((small[1] - small[0]) / 2, op.weight.abs()),
    )
    lo, hi = op.interval(small)
    assert torch.equal(lo, mid - spread) and torch.equal(hi, mid + spread)
