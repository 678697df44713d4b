"""Exact extremes of every hidden pre-activation of a small fully connected ReLU network
with two inputs, in rationals: the reference the MILP-refined bounds (``refine.py``) are
checked against, independent of any solver.

On a box of the plane the network is affine on each region of its activation patterns;
each region is a convex polygon, cut layer by layer by each neuron's zero line (exact
``Fraction`` clipping), and an affine function's extremes over a polygon are at its
vertices. The weights are floats, so exactly rationals: nothing is rounded."""

from __future__ import annotations

from fractions import Fraction

from torch import nn

Point = tuple[Fraction, Fraction]
Affine = tuple[list[list[Fraction]], list[Fraction]]  # rows (coefficients of x), constants


def clip(polygon: list[Point], coeff: list[Fraction], const: Fraction) -> list[Point]:
    """The part of a convex polygon where ``coeff . x + const >= 0`` (Sutherland-Hodgman)."""
    out: list[Point] = []
    for n, p in enumerate(polygon):
        q = polygon[(n + 1) % len(polygon)]
        vp = coeff[0] * p[0] + coeff[1] * p[1] + const
        vq = coeff[0] * q[0] + coeff[1] * q[1] + const
        if vp >= 0:
            out.append(p)
        if (vp > 0 > vq) or (vp < 0 < vq):
            t = vp / (vp - vq)
            out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
    return out


def extremes(net: nn.Sequential, lower, upper) -> list[list[tuple[Fraction, Fraction]]]:
    """Per hidden layer (each Linear followed by a ReLU), per neuron: (min, max) of its
    pre-activation over the box ``[lower, upper]`` of the two inputs."""
    lo, hi = [Fraction(float(v)) for v in lower], [Fraction(float(v)) for v in upper]
    box = [(lo[0], lo[1]), (hi[0], lo[1]), (hi[0], hi[1]), (lo[0], hi[1])]
    one, zero = Fraction(1), Fraction(0)
    regions: list[tuple[list[Point], Affine]] = [(box, ([[one, zero], [zero, one]], [zero, zero]))]
    linears = [m for m in net if isinstance(m, nn.Linear)]
    found = []
    for layer in linears[:-1]:
        weight = [[Fraction(float(w)) for w in row] for row in layer.weight.detach()]
        bias = [Fraction(float(b)) for b in layer.bias.detach()]
        low = [None] * len(bias)
        top = [None] * len(bias)
        cut = []
        for polygon, (rows, consts) in regions:
            pre = _compose(weight, bias, rows, consts)
            for i, (coeff, const) in enumerate(zip(*pre, strict=True)):
                values = [coeff[0] * p[0] + coeff[1] * p[1] + const for p in polygon]
                low[i] = min(values) if low[i] is None else min(low[i], *values)
                top[i] = max(values) if top[i] is None else max(top[i], *values)
            cut += _split(polygon, pre)
        found.append(list(zip(low, top, strict=True)))
        regions = cut
    return found


def _compose(weight, bias, rows, consts) -> Affine:
    """``weight (rows x + consts) + bias`` as coefficients of x and constants."""
    coeffs = [[sum(w * r[d] for w, r in zip(wr, rows, strict=True)) for d in (0, 1)]
              for wr in weight]  # fmt: skip
    return coeffs, [sum(w * c for w, c in zip(wr, consts, strict=True)) + b
                    for wr, b in zip(weight, bias, strict=True)]  # fmt: skip


def _split(polygon: list[Point], pre: Affine) -> list[tuple[list[Point], Affine]]:
    """The polygon cut by the sign of each pre-activation, with the ReLU's affine map on
    each piece (empty pieces dropped; a piece of zero area still bounds correctly)."""
    pieces = [(polygon, [])]
    zero = [Fraction(0), Fraction(0)]
    for coeff, const in zip(*pre, strict=True):
        nxt = []
        for poly, kept in pieces:
            on = clip(poly, coeff, const)
            off = clip(poly, [-coeff[0], -coeff[1]], -const)
            nxt += [(on, kept + [(coeff, const)])] if on else []
            nxt += [(off, kept + [(zero, Fraction(0))])] if off else []
        pieces = nxt
    return [(poly, ([c for c, _ in kept], [k for _, k in kept])) for poly, kept in pieces]
