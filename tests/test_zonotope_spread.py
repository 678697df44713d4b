"""DeepZ's carried absolute sum of the generators (``zonotope.py``): a ReLU's ``lambda s +
mu``, raised by its rounding bound, is never below the exact sum of the generators it
computed (``fractions.Fraction`` over the same float64 numbers), and an affine op's equals
the sum of its own output; the carried sum only widens the bounds and margins."""

from __future__ import annotations

from fractions import Fraction

import torch
from torch import nn

from aisafety.verification import zonotope
from aisafety.verification.graph import build_graph
from aisafety.verification.zonotope import affine, input_zonotope, relu


def _hidden(seed: int):
    """A float64 layer with weights over six decades, its zonotope before and after ReLU."""
    g = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Linear(40, 30)).double()
    with torch.no_grad():
        scale = 10.0 ** torch.randint(-3, 3, (30, 40), generator=g).double()
        net[0].weight.copy_(torch.randn(30, 40, generator=g, dtype=torch.float64) * scale)
        net[0].bias.copy_(torch.randn(30, generator=g, dtype=torch.float64))
    x = torch.randn(2, 40, generator=g, dtype=torch.float64)
    before = affine(build_graph(net, (40,)).ops[1], input_zonotope(x - 0.3, x + 0.3))
    return before, relu(before)


def _exact_sums(generators: torch.Tensor) -> list[Fraction]:
    rows = generators.flatten(2).transpose(1, 2).flatten(0, 1).tolist()  # (B * n, m)
    return [sum(abs(Fraction(v)) for v in row) for row in rows]


def _below(seeds: range) -> int:
    """Neurons whose carried sum is below the exact sum of the ReLU's computed generators."""
    below = 0
    for seed in seeds:
        _, (_, generators, _, carried) = _hidden(seed)
        exact = _exact_sums(generators)
        pairs = zip(carried.flatten().tolist(), exact, strict=True)
        below += sum(Fraction(c) < e for c, e in pairs)
    return below


def test_a_relus_carried_sum_is_never_below_the_exact_sum():
    assert _below(range(20)) == 0


def test_without_its_raise_the_carried_sum_falls_below_the_exact_one(monkeypatch):
    # the raise is needed: lambda s + mu as computed is below the exact sum somewhere
    monkeypatch.setattr(zonotope, "_carried", lambda spread, m: spread)
    assert _below(range(20)) > 0


def test_an_affine_ops_sum_is_its_outputs_sum():
    for seed in range(3):
        (_, generators, _, spread), _ = _hidden(seed)
        assert torch.equal(spread, generators.abs().sum(1))
