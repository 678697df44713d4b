"""The tangent point through an interval's end (``SShapeRelaxation._touch``), found by a
safeguarded Newton method, against the 50-step bisection it replaced and against its
defining equation. The bisection and the ``tangent_slopes`` around it are kept, as they
were, in testkit/sshape_bisection.py; bench/sshape_touch.py measures the speed against the
same reference."""

from __future__ import annotations

import pytest
import torch
from sshape_bisection import bisection_slopes as reference_slopes  # testkit/

from aisafety.verification import relaxations
from aisafety.verification.relaxations import SIGMOID, TANH
from tests.test_sshape_relaxation import intervals


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("relaxation", [SIGMOID, TANH])
def test_crowns_slopes_are_the_bisections_on_thousands_of_intervals(relaxation, dtype):
    """Both lines' slopes within 1e-9 of the bisection's (measured: 4.5e-12 at most), on
    intervals of every kind; the intervals across 0 with a tangent through an end (the
    only ones that use the point) are counted so the check is not vacuous."""
    for seed in (1, 8):
        lo, hi = (t.to(dtype).double() for t in intervals(10000, seed))
        down, up = relaxation.tangent_slopes(lo, hi)
        want_down, want_up = reference_slopes(relaxation, lo, hi)
        assert (down - want_down).abs().max() < 1e-9
        assert (up - want_up).abs().max() < 1e-9
        across = (lo < 0) & (hi > 0)
        chord = relaxation.chord(lo, hi)
        through_end = across & (chord >= relaxation.derivative(lo))
        assert through_end.sum() > 1000


@pytest.mark.parametrize("lower_line", [True, False])
@pytest.mark.parametrize("relaxation", [SIGMOID, TANH])
def test_the_point_solves_its_equation_and_the_search_ends_before_its_cap(
    relaxation, lower_line, monkeypatch
):
    """Where the tangent through an end a touches f on the other side of 0 (d in [l, 0]
    for the lower line through u, in [0, u] for the upper through l): f(d) + f'(d) (a - d)
    = f(a) up to float64 rounding (f' from f cancels in the tails: eps times a - d); each
    call takes at most 15 Newton steps (the cap is ``TOUCH_STEPS``, 40), counted through
    f's derivatives (one call a step)."""
    lo, hi = intervals(20000, seed=11)
    chord = relaxation.chord(lo, hi)
    inside = (lo < 0) & (hi > 0) & (chord >= relaxation.derivative(lo if lower_line else hi))
    lo, hi, chord = lo[inside], hi[inside], chord[inside]
    anchor = hi if lower_line else lo
    calls = []
    counted = relaxation.derivatives

    def counting(y):
        calls.append(1)
        return counted(y)

    monkeypatch.setattr(relaxation, "derivatives", counting)
    none = torch.zeros_like(inside[: len(lo)])
    ends = (~none, none) if lower_line else (none, ~none)
    d = relaxation._touch(lo, hi, chord, *ends)[0 if lower_line else 1]
    monkeypatch.undo()
    assert 0 < len(calls) <= 15 < relaxations.TOUCH_STEPS
    line = relaxation.fn(d) + relaxation.derivative(d) * (anchor - d)
    assert ((line - relaxation.fn(anchor)).abs() <= 1e-14 * (1 + (anchor - d).abs())).all()
    assert ((lo <= d) & (d <= 0)).all() if lower_line else ((d >= 0) & (d <= hi)).all()


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH])
def test_near_the_inflection_the_point_is_minus_half_the_far_end(relaxation):
    """By hand: near 0, f(z) = f(0) + f'(0) z + c z^3 + O(z^5), and the tangent at d
    through u meets the cubic where c (d - u)^2 (2 d + u) = 0: d = -u/2 up to O(u^3)
    (measured: 0.0125 u^3 for sigmoid, 0.05 u^3 for tanh)."""
    u = torch.tensor([1e-2, 3e-2, 1e-1], dtype=torch.float64)
    lo = torch.full_like(u, -1.0)
    every, none = torch.ones_like(u, dtype=torch.bool), torch.zeros_like(u, dtype=torch.bool)
    d, _ = relaxation._touch(lo, u, relaxation.chord(lo, u), every, none)
    assert ((d + u / 2).abs() <= 0.1 * u**3).all()
    _, d = relaxation._touch(-u, -lo, relaxation.chord(-u, -lo), none, every)  # mirrored
    assert ((d - u / 2).abs() <= 0.1 * u**3).all()
