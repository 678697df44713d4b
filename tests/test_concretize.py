"""``bounds.concretize`` (two batched products) against the exact minimum of ``A z`` over a
box, and its float64 rounding margin (``float64_margin.concretise_margin``) below it.

The exact minimum is ``fractions.Fraction`` arithmetic over the same float64 numbers. Rows
with terms of both signs at scales 1e-3..1e4 and some zeros cancel, so the rounded value
lands above the exact one on some rows: the margin must cover it for every summation order
the products take.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from aisafety.verification import bounds as b
from aisafety.verification.float64_margin import concretise_margin


def _case(seed: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Coefficients (2, 5, 3, 4) and a box (2, 3, 4) that make the sums cancel."""
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.randint(-3, 5, (2, 5, 3, 4), generator=g).double()
    a = torch.randn(2, 5, 3, 4, generator=g, dtype=torch.float64) * scale
    a[torch.rand(a.shape, generator=g) < 0.2] = 0.0
    lo = torch.randn(2, 3, 4, generator=g, dtype=torch.float64) * 100
    return a, (lo, lo + torch.rand(2, 3, 4, generator=g, dtype=torch.float64))


def _exact(a: torch.Tensor, box: tuple[torch.Tensor, torch.Tensor]) -> list[list[Fraction]]:
    """min of each row ``A z`` over the box, term by term in rational arithmetic."""
    out = []
    for s in range(a.shape[0]):
        ends = list(zip(box[0][s].flatten().tolist(), box[1][s].flatten().tolist(), strict=True))
        out.append([_row_min(row.flatten().tolist(), ends) for row in a[s]])
    return out


def _row_min(row: list[float], ends: list[tuple[float, float]]) -> Fraction:
    terms = zip(row, ends, strict=True)
    return sum(min(Fraction(c) * Fraction(lo), Fraction(c) * Fraction(hi)) for c, (lo, hi) in terms)


def _gaps(seed: int, margin: bool) -> list[Fraction]:
    """computed - exact per row (positive: above the exact minimum)."""
    a, box = _case(seed)
    value = b.concretize(a, box)
    if margin:
        value = value - concretise_margin(a, box)
    exact = _exact(a, box)
    return [Fraction(float(value[s, k])) - exact[s][k] for s in range(2) for k in range(5)]


def test_the_margin_keeps_concretize_below_the_exact_minimum():
    assert max(max(_gaps(seed, True)) for seed in range(40)) <= 0


def test_without_the_margin_concretize_is_above_the_exact_minimum_somewhere():
    # the cases cancel enough for the margin test above to test something
    assert max(max(_gaps(seed, False)) for seed in range(40)) > 0


def test_concretize_is_within_its_margin_of_the_exact_minimum():
    for seed in range(10):
        a, box = _case(seed)
        gaps = _gaps(seed, False)
        margin = concretise_margin(a, box).flatten().tolist()
        assert all(abs(g) <= Fraction(m) for g, m in zip(gaps, margin, strict=True))


def test_concretize_broadcasts_a_box_of_one_sample_and_keeps_float64_boxes():
    a, box = _case(0)
    one = (box[0][:1], box[1][:1])
    both = b.concretize(a, (one[0].expand(2, 3, 4), one[1].expand(2, 3, 4)))
    assert torch.equal(b.concretize(a, one), both)
    assert b.concretize(a.float(), box).dtype == torch.float64
