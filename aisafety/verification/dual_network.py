"""WK: the dual network of Wong & Kolter (2018), written as the paper's Algorithm 1.

For a bound of ``c . z_k`` (z_k: the input of the k-th ReLU layer, or the output), the dual
variables run backwards through the network: ``nu_hat = W^T nu`` through each affine layer
(here ``op.backward``, which for an affine op is its exact transpose) and ``nu = D nu_hat``
through each ReLU with D = 0 (dead), 1 (active) or u / (u - l) (unstable, the set I); the
bound is the dual objective

    J = sum_i nu_{i+1} . b_i + min_{x in box} nu_1 . x - sum_{i, j in I_i} l_ij [nu_ij]_-

(the paper's signs with nu -> -nu: it bounds from above). Every ReLU input's bounds come
from the same dual network started at that layer, layer by layer, for every neuron, with
no interval intersection: the paper's own method. Theory (Salman et al. 2019) says this
equals Fast-Lin, whose lower line has the same slope D; ``tests/test_dual_network.py``
shows it per row. Sequential ReLU networks only (no residual additions), as the paper.

Its bounds are certificates (the ``wk`` verifier) and the boxes of every later layer, so a
float64 pass subtracts its rounding margin op by op (``float64_margin.py``, as CROWN's):
the ReLU step is CROWN's upper line with Fast-Lin's slope D (intercept ``-D l``).
"""

from __future__ import annotations

import torch

from aisafety.verification import bounds as b
from aisafety.verification import float64_margin
from aisafety.verification.base import Verifier
from aisafety.verification.deadline import check_time
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.property import Property

AFFINE = {"dense", "conv", "elementwise", "reshape", "positive-linear"}


def dual_objective(graph: BoundGraph, start: int, c: torch.Tensor, boxes: list[Box]):
    """J (B, K): a lower bound of ``c . node_start`` over the box; and nu at the input."""
    nu, bound = c, c.new_zeros(c.shape[:2])
    margin = float64_margin.applies(c)
    slack, size = bound.new_zeros(()), bound.new_zeros(())
    for i in range(start, 0, -1):
        check_time()
        op, box = graph.ops[i], boxes[graph.ops[i].inputs[0]]
        if margin:
            slack = slack + float64_margin.op_slack(op, nu, [box])
        if op.kind == "activation":
            low, high = (t.unsqueeze(1) for t in box)
            unstable = (low < 0) & (high > 0)
            d = torch.where(
                unstable, high / (high - low).clamp(min=1e-300), (low >= 0).to(low.dtype)
            )
            nu = d * nu
            shift = -(low * unstable * nu.clamp(max=0)).flatten(2).sum(2)
        else:
            (nu,), shift = op.backward(nu, box)
        bound, size = bound + shift, size + shift.abs()
    value = bound + b.concretize(nu, boxes[0])
    if not margin:
        return value, nu
    ops = graph.ops[: start + 1]
    return float64_margin.lower(value, nu, boxes[0], size, slack, start + 4, ops), nu


def dual_boxes(graph: BoundGraph, lower: torch.Tensor, upper: torch.Tensor) -> list[Box]:
    """Every node's box: each ReLU input's from its own dual network (every neuron), the
    rest by intervals from those (they are only read at ReLU inputs and the input)."""
    boxes: list[Box] = [(lower, upper)]
    for op in graph.ops[1:]:
        box = op.interval(*(boxes[j] for j in op.inputs))
        if op.kind in AFFINE and _feeds_relu(graph, len(boxes)):
            n = box[0][0].numel()
            eye = torch.eye(n, dtype=lower.dtype).expand(len(lower), n, n)
            rows = torch.cat([eye, -eye], 1).reshape(len(lower), 2 * n, *op.out_shape)
            bound, _ = dual_objective(graph, len(boxes), rows, boxes + [box])
            box = bound[:, :n].reshape(box[0].shape), -bound[:, n:].reshape(box[0].shape)
        boxes.append(box)
    return boxes


def _feeds_relu(graph: BoundGraph, i: int) -> bool:
    return any(op.kind == "activation" and op.inputs == [i] for op in graph.ops)


class DualNetworkVerifier(Verifier):
    name = "wk"
    description = (
        "WK, the dual network (Wong & Kolter 2018): Algorithm 1's backward dual pass for "
        "every bound; equal to Fast-Lin in theory; sequential ReLU networks"
    )
    kinds = {"input", "activation"} | AFFINE

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        graph.require_sequential(self.name, use="'fast-lin' or 'crown'")

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        self.require_float64(graph, prop)
        boxes = dual_boxes(graph, prop.lower, prop.upper)
        c = prop.spec.reshape(*prop.spec.shape[:2], *graph.ops[-1].out_shape)
        return dual_objective(graph, len(graph.ops) - 1, c, boxes)
