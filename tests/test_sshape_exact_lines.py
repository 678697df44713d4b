"""The sigmoid and tanh lines against exact arithmetic, and the float64 margin's weight.

For a slope k, f(z) - k z is smooth, so its extremes on [l, u] lie at l, u or where
f'(z) = k: at most two points, +-z*, which have closed forms. Evaluating f there with
Python's ``decimal`` at 80 digits (its ``exp``, ``ln`` and ``sqrt`` are correctly
rounded), and the lines from their float64 slopes and intercepts exactly, checks each line
on the whole interval, not only at sampled points. ``float64_margin.weight`` bounds the
absolute terms ``|k| m + |b|`` of the lines (m = max |z| on the box) for the rounding
margin of a float64 pass: ``2 m + 1``, widened by the lines' own safety (``1e-7``), which
makes ``|b|`` exceed ``1 + |k| m`` (a tanh line of slope 1 on [-1e8, 1e8]: 2e8 + 9)."""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest
import torch

from aisafety.verification import float64_margin
from aisafety.verification.ops import Activation
from aisafety.verification.relaxations import SIGMOID, TANH

PREC = 80
TOLERANCE = Decimal("1e-60")  # far above the reference's own error, far below any line's


def f(name: str, z: Decimal) -> Decimal:
    if name == "sigmoid":
        return 1 / (1 + (-z).exp())
    if abs(z) < Decimal("1e-9"):
        return z - z**3 / 3 + 2 * z**5 / 15 - 17 * z**7 / 315
    e = (2 * z).exp()
    return (e - 1) / (e + 1)


def stationary(name: str, k: Decimal) -> list[Decimal]:
    """The z with f'(z) = k (none where k is not strictly between 0 and max f')."""
    top = Decimal("0.25") if name == "sigmoid" else Decimal(1)
    if not 0 < k < top:
        return []
    if name == "sigmoid":
        s = (1 + (1 - 4 * k).sqrt()) / 2
        z = (s / (1 - s)).ln()
    else:
        t = (1 - k).sqrt()
        z = ((1 + t) / (1 - t)).ln() / 2
    return [z, -z]


def worst_gap(name: str, k: float, b: float, lo: float, hi: float, below: bool) -> Decimal:
    """min over [lo, hi] of f - (k z + b) (``below``) or of (k z + b) - f."""
    with localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = PREC, 10**9, -(10**9)  # exp(2e8) has 8.7e7 digits
        kd, bd, lod, hid = (Decimal(v) for v in (k, b, lo, hi))
        points = [lod, hid] + [z for z in stationary(name, kd) if lod < z < hid]
        gaps = [f(name, z) - (kd * z + bd) for z in points]
        return min(gaps) if below else min(-g for g in gaps)


def boxes() -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-activation intervals at every scale: across 0, on either side, tiny and wide."""
    g = torch.Generator().manual_seed(0)
    parts = []
    for scale in (1e-6, 0.05, 1.0, 4.0, 30.0):
        a = torch.randn(60, generator=g, dtype=torch.float64) * scale
        w = torch.rand(60, generator=g, dtype=torch.float64) * scale * 2
        parts.append(torch.stack([a, a + w], 1))
    extra = torch.tensor([[-1e8, 1e8], [-3.0, 3.0], [0.0, 1e-12], [-40.0, 40.0], [5.0, 40.0]],
                         dtype=torch.float64)  # fmt: skip
    ends = torch.cat(parts + [extra])
    return ends[:, 0].unsqueeze(0), ends[:, 1].unsqueeze(0)


def all_lines(relaxation):
    """(slope rule, lw, lb, uw, ub) for CROWN's slopes, the chord and searched slopes at
    positions 0, 1 and random (alpha-CROWN), each (n,)."""
    lo, hi = boxes()
    n = lo.shape[1]
    yield "crown", *(t.flatten() for t in relaxation.lines(lo, hi))
    chord = type(relaxation)(**{**vars(relaxation), "rule": "chord"})
    yield "chord", *(t.flatten() for t in chord.lines(lo, hi))
    g = torch.Generator().manual_seed(1)
    searched = torch.rand((1, 1, 2, n), generator=g, dtype=torch.float64)
    for name, at in (("least", torch.zeros_like(searched)), ("most", torch.ones_like(searched)),
                     ("searched", searched)):  # fmt: skip
        yield name, *(t.flatten() for t in relaxation.lines(lo, hi, at))


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH], ids=["sigmoid", "tanh"])
def test_every_line_holds_on_its_whole_interval_in_exact_arithmetic(relaxation):
    lo, hi = (t.flatten().tolist() for t in boxes())
    wrong = []
    for rule, lw, lb, uw, ub in all_lines(relaxation):
        for i, (a, z) in enumerate(zip(lo, hi, strict=True)):
            for k, b, below in ((lw[i], lb[i], True), (uw[i], ub[i], False)):
                gap = worst_gap(relaxation.name, float(k), float(b), a, z, below)
                if gap < -TOLERANCE * (1 + abs(Decimal(float(b)))):
                    wrong.append((rule, a, z, below, float(gap)))
    assert wrong == []


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH], ids=["sigmoid", "tanh"])
def test_the_slopes_stay_within_the_largest_derivative(relaxation):
    """Up to rounding: a chord on an interval 1e-9 wide near 0 divides sigmoid's rounding
    (an ulp of 0.5) by the width (0.2500000012 measured); tanh's values there are tiny."""
    top = 0.25 * (1 + 1e-6) if relaxation is SIGMOID else 1 + 1e-12
    for _, lw, _, uw, _ in all_lines(relaxation):
        assert float(torch.cat([lw, uw]).abs().max()) <= top


def _excess(relaxation, weight) -> list[tuple[str, float, float]]:
    """Lines whose absolute terms |k| m + |b| (exact) exceed ``weight(m)``."""
    lo, hi = boxes()
    m = torch.maximum(lo.abs(), hi.abs()).flatten()
    bound = weight(m).tolist()
    over = []
    for rule, lw, lb, uw, ub in all_lines(relaxation):
        for k, b in ((lw, lb), (uw, ub)):
            rows = zip(k.tolist(), b.tolist(), m.tolist(), strict=True)
            terms = [abs(Decimal(ki)) * Decimal(mi) + abs(Decimal(bi)) for ki, bi, mi in rows]
            over += [(rule, float(t), v) for t, v in zip(terms, bound, strict=True)
                     if t > Decimal(v)]  # fmt: skip
    return over


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH], ids=["sigmoid", "tanh"])
def test_the_float64_margins_weight_bounds_every_lines_terms(relaxation):
    op = Activation("act", [0], (1,), fn=relaxation.fn, relaxation=relaxation)
    weight = lambda m: float64_margin._weight(op, (-m, m))  # noqa: E731
    assert _excess(relaxation, weight) == []


def test_two_m_plus_one_alone_falls_short_on_a_wide_tanh_box():
    """Why the weight carries the lines' safety: 2 m + 1 is exceeded by the widening."""
    over = _excess(TANH, lambda m: 2 * m + 1)
    assert over and max(t - v for _, t, v in over) <= 1e-7 * 2e8 * 2
