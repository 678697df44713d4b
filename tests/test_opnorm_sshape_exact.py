"""Op-Norm through sigmoid and tanh against its own formula in 60-digit arithmetic.

The bound is ``g(c) - K max_i r_i`` with ``K = ||C W_L||_1 prod ||W_i||_inf->inf`` times
1/4 per sigmoid (1 per tanh); ``lipschitz_rounding.py`` bounds its float64 rounding (the
forward pass at the centre with the functions' ``FUNCTION_ULPS``, the constant's products).
Here the float64 bound must be below the formula evaluated exactly (weights and box as the
exact rationals their float64 values are, sigmoid and tanh by mpmath at 60 digits), and
close to it; the same formula computed in float64 without the margins is above it on some
seeds, so the check can fail."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.property import Property
from aisafety.verification.registry import make_verifier

mpmath.mp.dps = 60
ROW = [1.0, -1.0, 0.0]
FUNCTIONS = {"sigmoid": (nn.Sigmoid, lambda x: 1 / (1 + mpmath.exp(-x)), Fraction(1, 4)),
             "tanh": (nn.Tanh, mpmath.tanh, Fraction(1))}  # fmt: skip


def _net(seed: int, kind: str) -> nn.Sequential:
    torch.manual_seed(seed)
    act = FUNCTIONS[kind][0]
    net = nn.Sequential(nn.Linear(12, 10), act(), nn.Linear(10, 8), act(), nn.Linear(8, 3))
    return net.double().eval()


def _mp(x: Fraction | float) -> mpmath.mpf:
    x = Fraction(x)
    return mpmath.mpf(x.numerator) / x.denominator


def _formula(net: nn.Sequential, lo: torch.Tensor, hi: torch.Tensor, kind: str) -> mpmath.mpf:
    """``g(c) - K max r`` with every quantity exact but the functions (60 digits)."""
    f, slope = FUNCTIONS[kind][1], FUNCTIONS[kind][2]
    los, his = lo[0].tolist(), hi[0].tolist()
    centre = [(Fraction(a) + Fraction(b)) / 2 for a, b in zip(los, his, strict=True)]
    radius = max((Fraction(b) - Fraction(a)) / 2 for a, b in zip(los, his, strict=True))
    x = [_mp(v) for v in centre]
    layers = [m for m in net if isinstance(m, nn.Linear)]
    for i, layer in enumerate(layers):
        w, b = layer.weight.tolist(), layer.bias.tolist()
        x = [sum(_mp(wij) * xj for wij, xj in zip(row, x, strict=True)) + _mp(bi)
             for row, bi in zip(w, b, strict=True)]  # fmt: skip
        if i < len(layers) - 1:
            x = [f(v) for v in x]
    value = sum(_mp(r) * v for r, v in zip(ROW, x, strict=True))
    last = layers[-1].weight.tolist()
    k = sum(abs(sum(Fraction(r) * Fraction(last[o][i]) for o, r in enumerate(ROW)))
            for i in range(len(last[0])))  # fmt: skip
    for layer in layers[:-1]:
        k *= max(sum(abs(Fraction(v)) for v in row) for row in layer.weight.tolist()) * slope
    return value - _mp(k * radius)


def _plain(net: nn.Sequential, lo: torch.Tensor, hi: torch.Tensor, kind: str) -> float:
    """The same formula in float64, rounded to nearest, without any margin."""
    row = torch.tensor(ROW, dtype=torch.float64)
    layers = [m for m in net if isinstance(m, nn.Linear)]
    with torch.no_grad():
        k = (row @ layers[-1].weight).abs().sum()
        for layer in layers[:-1]:
            k = k * layer.weight.abs().sum(1).max() * float(FUNCTIONS[kind][2])
        value = row @ net((lo + hi) / 2)[0]
        return float(value - k * ((hi - lo) / 2).max())


def _box(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(1, 12, generator=g, dtype=torch.float64) * 3
    radius = torch.rand(1, 12, generator=g, dtype=torch.float64) * 1e-6
    return centre - radius, centre + radius


@pytest.mark.parametrize("kind", ["sigmoid", "tanh"])
def test_op_norm_is_below_its_exact_formula_and_close(kind):
    plain_above = 0
    for seed in range(12):
        net, (lo, hi) = _net(seed, kind), _box(seed)
        graph = build_graph(net, (12,))
        spec = torch.tensor([[ROW]], dtype=torch.float64)
        prop = Property(lo, hi, spec, torch.zeros(1, 1, dtype=torch.float64))
        with torch.no_grad():
            bound = float(make_verifier(default_registry(), "op-norm").lower_bounds(
                graph, prop)[0].flatten()[0])  # fmt: skip
            plain = _plain(net, lo, hi, kind)
        exact = _formula(net, lo, hi, kind)
        assert _mp(bound) <= exact, seed
        assert exact - _mp(bound) <= 1e-9 * (1 + abs(exact)), seed  # the margin is rounding
        plain_above += _mp(plain) > exact
    assert plain_above >= 2  # the formula in float64 without margins is above it
