"""A property's offset ``d`` added to a proved bound is rounded toward -inf
(``float64_margin.added_down``): the nearest float64 sum can be half an ulp above the exact
one, and the stored float32 margin (rounded down from the float64 one) then above it."""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import build_graph
from aisafety.verification.property import Property
from aisafety.verification.registry import make_verifier


def test_the_sum_is_never_above_the_exact_one_and_nearest_where_exact():
    g = torch.Generator().manual_seed(0)
    b = torch.randn(20000, generator=g, dtype=torch.float64) * 10 ** torch.randint(-8, 8, (20000,))
    d = torch.randn(20000, generator=g, dtype=torch.float64) * 10 ** torch.randint(-8, 8, (20000,))
    plain, down = b + d, added_down(b, d)
    above = 0
    for bi, di, pi, si in zip(b.tolist(), d.tolist(), plain.tolist(), down.tolist(), strict=True):
        exact = Fraction(bi) + Fraction(di)
        assert Fraction(si) <= exact
        assert si == pi or (Fraction(pi) > exact and si == math.nextafter(pi, -math.inf))
        above += Fraction(pi) > exact
    assert above > 1000  # round to nearest is above the exact sum on many pairs
    inf = torch.tensor([torch.inf, -torch.inf], dtype=torch.float64)
    assert torch.equal(added_down(inf, torch.zeros(2, dtype=torch.float64)), inf)


def test_a_certified_margin_is_not_above_bound_plus_offset(monkeypatch):
    """A proved bound 1.0 (f = x on [1, 2]) and d = -2^-60: the exact margin is 1 - 2^-60,
    which float64 rounds up to 1.0 and float32 keeps; stored 1.0 it was above the proof."""
    net = nn.Linear(1, 1)
    with torch.no_grad():
        net.weight.fill_(1.0)
        net.bias.zero_()
    graph = build_graph(net.double(), (1,))
    lo, hi = torch.ones(1, 1, dtype=torch.float64), torch.full((1, 1), 2.0, dtype=torch.float64)
    offset = torch.tensor([[-(2.0**-60)]], dtype=torch.float64)
    prop = Property(lo, hi, torch.ones(1, 1, 1, dtype=torch.float64), offset)
    verifier = make_verifier(default_registry(), "crown")
    one = torch.ones(1, 1, dtype=torch.float64)
    monkeypatch.setattr(verifier, "lower_bounds", lambda graph, prop: (one, None))
    result = verifier.verify(graph, prop)
    assert result.verdicts[0].value == "certified"
    assert Fraction(float(result.margins[0])) <= 1 - Fraction(1, 2**60)
