"""CROWN's float64 passes, IBP's folded spec and the dual network (``wk``) stay below the
exact (rational) bound.

On a net whose relaxation is exact (a linear layer, or ReLUs all stably active) the exact
bound is the minimum of an affine map over the box, computed here with
``fractions.Fraction`` from the same float64 numbers. Rounded to nearest without a margin,
the computed bound was above it on about half the seeds (by up to 6e-12).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from aisafety.verification import bounds as b
from aisafety.verification import rounding
from aisafety.verification.dual_network import dual_boxes, dual_objective
from aisafety.verification.graph import build_graph

SEEDS = range(12)


def _net(seed: int, hidden: bool) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    """A float64 net (hidden ReLUs stably active: large biases) and a box around a point."""
    g = torch.Generator().manual_seed(seed)
    layers = [nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)] if hidden else [nn.Linear(12, 3)]
    net = nn.Sequential(*layers).double()
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g, dtype=torch.float64) * 3)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g, dtype=torch.float64) * 5)
        net[0].bias += 1000.0
    x = torch.rand(1, 12, generator=g, dtype=torch.float64) * 7 - 3
    return net, x - 0.01, x + 0.01


def _exact_min(net: nn.Sequential, lo: torch.Tensor, hi: torch.Tensor, row: list[float]):
    """min of ``row . net(x)`` over the box, the ReLUs being the identity there."""
    r, const = [Fraction(v) for v in row], Fraction(0)
    for m in reversed([m for m in net if isinstance(m, nn.Linear)]):
        w = [[Fraction(v) for v in line] for line in m.weight.tolist()]
        const += sum(ri * Fraction(bi) for ri, bi in zip(r, m.bias.tolist(), strict=True))
        r = [sum(r[i] * w[i][j] for i in range(len(r))) for j in range(len(w[0]))]
    ends = zip(r, lo[0].tolist(), hi[0].tolist(), strict=True)
    return const + sum(min(ri * Fraction(a), ri * Fraction(z)) for ri, a, z in ends)


def _above(hidden: bool, bound) -> list[float]:
    """By how much the bound is above the exact one, per seed where it is."""
    above = []
    for seed in SEEDS:
        net, lo, hi = _net(seed, hidden)
        graph = build_graph(net, (12,))
        spec = torch.tensor([[[1.0, -1.0, 0.0]]], dtype=torch.float64)
        with torch.no_grad():
            boxes = b.linear_boxes(graph, lo, hi)
            value = Fraction(float(bound(graph, boxes, spec).flatten()[0]))
        gap = value - _exact_min(net, lo, hi, [1.0, -1.0, 0.0])
        if gap > 0:
            above.append(float(gap))
    return above


def _crown(graph, boxes, spec):
    return b.spec_lower(graph, boxes, spec)[0]


@pytest.mark.parametrize("hidden", [False, True])
def test_a_float64_crown_bound_is_never_above_the_exact_one(hidden):
    with rounding.pass_precision("float64"):
        assert _above(hidden, _crown) == []


@pytest.mark.parametrize("hidden", [False, True])
def test_ibp_folded_spec_bound_is_never_above_the_exact_one(hidden):
    assert _above(hidden, b.ibp_spec_lower) == []


def _dual(graph, boxes, spec):
    """``wk``'s bound: every box from its own dual network, from the input box on."""
    own = dual_boxes(graph, *boxes[0])
    c = spec.reshape(*spec.shape[:2], *graph.ops[-1].out_shape)
    return dual_objective(graph, len(graph.ops) - 1, c, own)[0]


@pytest.mark.parametrize("hidden", [False, True])
def test_the_dual_networks_bound_is_never_above_the_exact_one(hidden):
    assert _above(hidden, _dual) == []


def test_the_float64_margin_is_float64_rounding_only():
    """A few gamma_n of the bound's terms (~1e-13 here), not float32's margin (~1e-5)."""
    net, lo, hi = _net(0, True)
    graph = build_graph(net, (12,))
    spec = torch.tensor([[[1.0, -1.0, 0.0]]], dtype=torch.float64)
    with torch.no_grad():
        boxes = b.linear_boxes(graph, lo, hi)
        bound = float(_crown(graph, boxes, spec).flatten()[0])
    exact = float(_exact_min(net, lo, hi, [1.0, -1.0, 0.0]))
    assert 0 <= exact - bound <= 1e-10 * abs(exact)
