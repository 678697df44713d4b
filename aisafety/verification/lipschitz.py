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

from dataclasses import replace

import torch

from aisafety.verification import bounds as b
from aisafety.verification.base import Verifier
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Op
from aisafety.verification.property import Property
from aisafety.verification.relaxations import SIGMOID

SEQUENTIAL_KINDS = {"input", "dense", "conv", "elementwise", "reshape", "positive-linear",
                    "activation"}  # fmt: skip


def centre_rows(graph: BoundGraph, prop: Property) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``C f + d`` at the box centre (B, K), and the box's half-widths."""
    centre, radius = (prop.upper + prop.lower) / 2, (prop.upper - prop.lower) / 2
    return prop.rows(graph.forward(centre)), radius


def row_gradient(graph: BoundGraph, prop: Property) -> torch.Tensor:
    """``C W_L`` pulled back through the last affine op: (B, K, *its input)."""
    out = graph.ops[-1]
    c = prop.spec.reshape(*prop.spec.shape[:2], *out.out_shape)
    (back,), _ = out.backward(c, None)
    return back


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
        value, radius = centre_rows(graph, prop)
        constant = row_gradient(graph, prop).abs().flatten(2).sum(2)
        for op in graph.ops[1:-1]:
            if op.kind == "activation":
                constant = constant * (0.25 if op.relaxation is SIGMOID else 1.0)
            else:
                shape = graph.ops[op.inputs[0]].out_shape
                constant = constant * inf_norm(op, value.new_zeros(1, *shape))
        return value - constant * radius.flatten(1).amax(1, keepdim=True), None


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
        value, radius = centre_rows(graph, prop)
        bound = jacobian_bound(graph, prop)  # (B, K, *input)
        return value - (bound * radius.unsqueeze(1)).flatten(2).sum(2), None


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
                (rad,), _ = _absolute(op).backward(rad, None)
    return mid.abs() if rad is None else mid.abs() + rad


def _absolute(op: Op) -> Op:
    """``op`` with |weights| and no bias: its backward maps r to |W|^T r."""
    changes = {}
    for key in ("weight", "scale"):
        if getattr(op, key, None) is not None:
            changes[key] = getattr(op, key).abs()
    for key in ("bias", "shift"):
        if getattr(op, key, None) is not None:
            changes[key] = torch.zeros_like(getattr(op, key))
    return replace(op, **changes) if changes else op
