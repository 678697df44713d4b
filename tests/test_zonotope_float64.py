"""DeepZ, RefineZono and the Lipschitz verifiers (Op-Norm, FastLip, RecurJac) in float64
stay below the exact (rational) bound, DeepZ's ReLU transformer holds in exact arithmetic,
and the Lipschitz verifiers count a property's offset once.

On a net whose relaxation is exact (one dense layer, or ReLUs all stably active) DeepZ's
bound is the minimum of an affine map over the box, computed with ``fractions.Fraction``
from the same float64 numbers (``tests/test_float64_margin.py``'s nets and reference).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from test_float64_margin import SEEDS, _exact_min, _net

from aisafety.plugins import default_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.property import Property
from aisafety.verification.registry import make_verifier
from aisafety.verification.zonotope import input_zonotope, relu

ROW = [1.0, -1.0, 0.0]


def _above(name: str, hidden: bool) -> list[float]:
    """By how much the verifier's bound is above the exact one, per seed where it is."""
    above = []
    for seed in SEEDS:
        net, lo, hi = _net(seed, hidden)
        graph = build_graph(net, (12,))
        spec = torch.tensor([[ROW]], dtype=torch.float64)
        prop = Property(lo, hi, spec, torch.zeros(1, 1, dtype=torch.float64))
        with torch.no_grad():
            bound = make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]
        gap = Fraction(float(bound.flatten()[0])) - _exact_min(net, lo, hi, ROW)
        if gap > 0:
            above.append(float(gap))
    return above


@pytest.mark.parametrize("name", ["deepz", "refinezono", "op-norm", "fastlip", "recurjac"])
@pytest.mark.parametrize("hidden", [False, True])
def test_a_float64_bound_is_never_above_the_exact_one(name, hidden):
    assert _above(name, hidden) == []


def _misses(seed: int) -> int:
    """Unstable neurons (one generator each) whose exact ReLU leaves the computed output
    zonotope, checked at the generator's ends and at the kink (the extremes of the
    piecewise linear ``relu(x) - lambda x``), in ``Fraction`` arithmetic."""
    g = torch.Generator().manual_seed(seed)
    n = 400
    scale = 10.0 ** torch.randint(-6, 4, (1, n), generator=g).double()
    lo = -torch.rand(1, n, generator=g, dtype=torch.float64) * scale
    hi = torch.rand(1, n, generator=g, dtype=torch.float64) * scale * 3
    zonotope = input_zonotope(lo, hi)
    out = relu(zonotope)
    c, gen = zonotope[0][0].tolist(), zonotope[1][0]
    c2, gen2 = out[0][0].tolist(), out[1][0]
    err2 = out[2][0].tolist() if len(out) > 2 else [0.0] * n
    misses = 0
    for i in range(n):
        a, ga = Fraction(c[i]), Fraction(float(gen[i, i]))
        b, gb = Fraction(c2[i]), Fraction(float(gen2[i, i]))
        fresh = sum(abs(Fraction(float(v))) for v in gen2[n:, i].tolist())
        slack = fresh + Fraction(err2[i])
        kinks = [Fraction(-1), Fraction(1)] + ([-a / ga] if ga != 0 else [])
        for e in (k for k in kinks if -1 <= k <= 1):
            x = a + ga * e
            if abs(max(x, Fraction(0)) - (b + gb * e)) > slack:
                misses += 1
                break
    return misses


def test_deepzs_relu_holds_in_exact_arithmetic():
    assert [_misses(seed) for seed in range(6)] == [0] * 6


@pytest.mark.parametrize("name", ["deepz", "fastlip", "recurjac"])
def test_the_float64_margin_is_float64_rounding_only(name):
    """A few gamma_n of the bound's terms, not a loosened bound (the relaxation is exact)."""
    net, lo, hi = _net(0, True)
    graph = build_graph(net, (12,))
    prop = Property(
        lo, hi, torch.tensor([[ROW]], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)
    )
    with torch.no_grad():
        bound = make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]
    exact = float(_exact_min(net, lo, hi, ROW))
    assert 0 <= exact - float(bound.flatten()[0]) <= 1e-10 * abs(exact)


@pytest.mark.parametrize("name", ["op-norm", "fastlip", "recurjac", "deepz"])
def test_a_propertys_offset_is_counted_once(name):
    """On a linear layer every one of these is exact: its margin is CROWN's, offset or not
    (the Lipschitz verifiers added ``d`` in their rows and the caller added it again:
    a margin of 199.4 where the true minimum is 99.4)."""
    net, lo, hi = _net(1, False)
    graph = build_graph(net, (12,))
    spec = torch.tensor([[ROW]], dtype=torch.float64)
    prop = Property(lo, hi, spec, torch.tensor([[100.0]], dtype=torch.float64))
    margin = make_verifier(default_registry(), name).verify(graph, prop).margins
    crown = make_verifier(default_registry(), "crown").verify(graph, prop).margins
    exact = float(_exact_min(net, lo, hi, ROW)) + 100
    assert float(margin[0]) == pytest.approx(float(crown[0]), rel=1e-6)
    assert float(margin[0]) <= exact
