"""Lipschitz verifiers: a spec row's value at the box centre minus how far its gradient can
take it, g(x) >= g(c) - sum_i G_i |x_i - c_i| with G_i >= sup_box |dg/dx_i|.

* Op-Norm (Szegedy et al. 2014; the SoK's global baseline): one constant per row,
  ||grad g||_1 <= ||W_L^T c||_1 prod_{i<L} ||W_i||_inf->inf (each activation's slope <= 1,
  sigmoid's <= 1/4), so G_i = that constant for every i.
* FastLip (Weng et al. 2018): the Jacobian bounded elementwise over the box, backwards
  from the row in interval arithmetic, each ReLU's derivative in {0}, {1} or [0, 1] from
  Fast-Lin's bounds of its input.

Both hold on the whole box, so the bound is sound; a certified radius follows from the
certified metrics' bisection on the radius (``average-certified-radius``). Sequential
graphs only (no residual Add); FastLip needs ReLUs (its derivative sets), Op-Norm takes
sigmoid and tanh too.
"""

from __future__ import annotations

import torch

from aisafety.verification import bounds as b
from aisafety.verification import float64_margin as fm
from aisafety.verification.base import Verifier
from aisafety.verification.budget import numel as budget_numel
from aisafety.verification.graph import BoundGraph
from aisafety.verification.lipschitz_rounding import (
    absolute,
    covering_radius,
    forward_error,
    gradient_error,
    lower,
    rows_error,
    widest,
)
from aisafety.verification.ops import Op
from aisafety.verification.property import Property
from aisafety.verification.relaxations import SIGMOID

SEQUENTIAL_KINDS = {"input", "dense", "conv", "elementwise", "reshape", "positive-linear",
                    "activation"}  # fmt: skip


def centre_rows(graph: BoundGraph, prop: Property) -> tuple[torch.Tensor, torch.Tensor]:
    """A lower bound of the rows ``C f`` at the box centre (B, K), without the offset ``d``
    (the verifier's caller adds it to every bound), and half-widths that cover the box from
    that centre (their float64 rounding included: ``lipschitz_rounding.py``)."""
    centre, radius = (prop.upper + prop.lower) / 2, (prop.upper - prop.lower) / 2
    spec = prop.spec.to(graph.dtype)
    outputs = graph.forward(centre).flatten(1)
    rows = (spec @ outputs.unsqueeze(2)).squeeze(2)
    error = rows_error(spec, outputs, forward_error(graph, centre))
    return rows - error, covering_radius(centre, radius)


def row_gradient(graph: BoundGraph, prop: Property) -> torch.Tensor:
    """``C W_L`` pulled back through the last affine op: (B, K, *its input)."""
    out = graph.ops[-1]
    c = prop.spec.reshape(*prop.spec.shape[:2], *out.out_shape)
    (back,), _ = out.backward(c, None)
    return back


def absolute_last(graph: BoundGraph) -> torch.Tensor:
    """``|W_L|`` of the last affine op as (outputs, its input's size)."""
    out = graph.ops[-1]
    eye = torch.eye(budget_numel(out.out_shape), dtype=graph.dtype)
    (back,), _ = absolute(out).backward(eye.reshape(1, -1, *out.out_shape), None)
    return back.flatten(2)[0]


def inf_norm(op: Op, like: torch.Tensor) -> float:
    """||W||_inf->inf of an affine op (its largest absolute row sum): the half-width of its
    output on the centred unit box, bias removed."""
    ones = torch.ones_like(like)
    lo, hi = op.interval((-ones, ones))
    return float(((hi - lo) / 2).max())


class OpNormVerifier(Verifier):
    name = "op-norm"
    description = (
        "Op-Norm: the row at the centre minus a global Lipschitz constant (the product of "
        "the layers' operator norms) times the box radius; sequential networks"
    )
    kinds = SEQUENTIAL_KINDS

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        graph.require_sequential(self.name, relu=False)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        self.require_float64(graph, prop)
        value, radius = centre_rows(graph, prop)
        constant = row_gradient(graph, prop).abs().flatten(2).sum(2)
        # ``C W_L`` cancels; the rest are products of non-negative numbers
        size = (prop.spec.to(graph.dtype).abs().flatten(2) @ absolute_last(graph)).sum(2)
        for op in graph.ops[1:-1]:
            if op.kind == "activation":
                scale = 0.25 if op.relaxation is SIGMOID else 1.0
            else:
                scale = inf_norm(op, value.new_zeros(1, *graph.ops[op.inputs[0]].out_shape))
            constant, size = constant * scale, size * scale
        n = len(graph.ops) * (widest(graph) + 4)
        spent = (constant + fm.slack(n, size + constant)) * radius.flatten(1).amax(1, keepdim=True)
        return value - spent - fm.slack(2, spent + value.abs()), None


class FastLipVerifier(Verifier):
    name = "fastlip"
    description = (
        "FastLip (Weng et al. 2018): the row at the centre minus the Jacobian's elementwise "
        "bound over the box (interval arithmetic, ReLU derivative sets from Fast-Lin bounds) "
        "times the radius; sequential ReLU networks"
    )
    kinds = SEQUENTIAL_KINDS
    tighter_than = ("op-norm",)  # |W|^T propagation never exceeds the operator norms

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        graph.require_sequential(self.name)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        self.require_float64(graph, prop)
        value, radius = centre_rows(graph, prop)
        bound = jacobian_bound(graph, prop)  # (B, K, *input)
        bound = bound + gradient_error(graph, prop.spec.to(graph.dtype))
        return lower(value, bound, radius), None


def jacobian_bound(graph: BoundGraph, prop: Property) -> torch.Tensor:
    """G >= |d row / d x| elementwise on the box, (B, K, *input)."""
    boxes = b.linear_boxes(graph, prop.lower, prop.upper, "parallel")
    mid, rad = row_gradient(graph, prop), None
    for i in range(len(graph.ops) - 2, 0, -1):
        op = graph.ops[i]
        if op.kind == "activation":
            low, high = (t.unsqueeze(1) for t in boxes[op.inputs[0]])
            d_lo, d_hi = (low >= 0).to(low.dtype), (high > 0).to(low.dtype)
            lo, hi = (mid, mid) if rad is None else (mid - rad, mid + rad)
            ends = torch.stack([lo * d_lo, lo * d_hi, hi * d_lo, hi * d_hi])
            lo, hi = ends.amin(0), ends.amax(0)
            mid, rad = (hi + lo) / 2, (hi - lo) / 2
        else:
            (mid,), _ = op.backward(mid, None)
            if rad is not None:
                (rad,), _ = absolute(op).backward(rad, None)
    return mid.abs() if rad is None else mid.abs() + rad
