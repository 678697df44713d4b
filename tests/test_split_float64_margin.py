"""Branch and bound's float64 pass (``split_bounds.split_backward``) stays below the exact
bound of its relaxation, beta terms included.

With every unstable ReLU split, the relaxation of a one-hidden-layer net is exact, so the
pass bounds ``c f(x) - sum_j beta_j s_j z_j(x)`` (affine in x on the domain) by its minimum
over the box; ``fractions.Fraction`` computes that minimum from the same float64 numbers.
Rounded to nearest without a margin, the computed bound was above it on 19 of 40 seeds (by
up to 8.7e-14; docs/certification.md)."""

from __future__ import annotations

from fractions import Fraction

import torch
from torch import nn

from aisafety.verification import bounds as b
from aisafety.verification import split_bounds as sb
from aisafety.verification.graph import build_graph

ROW = [1.0, -1.0, 0.0]


def _net(seed: int) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor, torch.Generator]:
    """A float64 12-8-3 ReLU net with output biases ~1000 and a box with unstable ReLUs."""
    g = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    with torch.no_grad():
        for m in (net[0], net[2]):
            m.weight.copy_(torch.randn(m.weight.shape, generator=g, dtype=torch.float64) * 3)
            m.bias.copy_(torch.randn(m.bias.shape, generator=g, dtype=torch.float64) * 5)
        net[2].bias += 1000.0
    x = torch.rand(1, 12, generator=g, dtype=torch.float64) * 7 - 3
    return net, x - 0.5, x + 0.5, g


def _fractions(t: torch.Tensor) -> list:
    return [_fractions(r) for r in t] if t.dim() > 1 else [Fraction(v) for v in t.tolist()]


def _exact_min(net, lo, hi, at_z_extra: list[Fraction], identity: list[bool]) -> Fraction:
    """min over the box of ``ROW . net(x) + at_z_extra . z(x)``, z = W1 x + b1 the ReLUs'
    input, each ReLU the identity or zero (``identity``) on the domain."""
    w1, b1 = _fractions(net[0].weight.detach()), _fractions(net[0].bias.detach())
    w2, b2 = _fractions(net[2].weight.detach()), _fractions(net[2].bias.detach())
    c = [Fraction(v) for v in ROW]
    at_out = [sum(c[k] * w2[k][j] for k in range(3)) for j in range(8)]
    at_z = [at_out[j] * identity[j] + at_z_extra[j] for j in range(8)]
    const = sum(c[k] * b2[k] for k in range(3)) + sum(at_z[j] * b1[j] for j in range(8))
    r = [sum(at_z[j] * w1[j][i] for j in range(8)) for i in range(12)]
    ends = zip(r, _fractions(lo[0]), _fractions(hi[0]), strict=True)
    return const + sum(min(ri * a, ri * z) for ri, a, z in ends)


def _gap(seed: int) -> Fraction:
    """The float64 domain bound minus the exact one (every unstable ReLU split at random,
    multipliers beta in [0, 4])."""
    net, lo, hi, g = _net(seed)
    graph = build_graph(net, (12,))
    spec = torch.tensor([ROW], dtype=torch.float64)
    with torch.no_grad():
        root = b.linear_boxes(graph, lo, hi)
        dom = sb.root_domains(graph, root, spec, torch.zeros(1, dtype=torch.float64), [0])
        i = sb.relu_nodes(graph)[0]
        z_lo, z_hi = (t.reshape(-1) for t in root[graph.ops[i].inputs[0]])
        sign = torch.where(torch.rand(8, generator=g) < 0.5, 1, -1)
        s = (sign * ((z_lo < 0) & (z_hi > 0))).to(torch.int8)
        beta = torch.rand(1, 1, 8, generator=g, dtype=torch.float64) * 4
        dom.splits[i], dom.beta[i] = s.reshape(1, 8), beta
        boxes = sb.domain_boxes(graph, root, dom)
        alpha = {i: dom.alpha[i].double()}
        bound = sb.split_backward(graph, dom, boxes, alpha, {i: beta})[0]
    identity = [bool(z_lo[j] >= 0) or int(s[j]) == 1 for j in range(8)]
    extra = [-Fraction(bj) * int(sj) for bj, sj in zip(beta.flatten().tolist(), s, strict=True)]
    return Fraction(float(bound[0])) - _exact_min(net, lo, hi, extra, identity)


def test_a_float64_domain_bound_is_never_above_the_exact_one():
    gaps = [_gap(seed) for seed in range(24)]
    assert [float(gap) for gap in gaps if gap > 0] == []


def test_the_domain_margin_is_float64_rounding_only():
    """A few gamma_n of the bound's terms (~1e-11 here), not float32's margin (~1e-5)."""
    for seed in range(4):
        assert -1e-10 <= float(_gap(seed)) <= 0
