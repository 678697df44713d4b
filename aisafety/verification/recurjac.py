"""RecurJac (Zhang et al. 2019): the Jacobian of a spec row bounded elementwise by a
recursion that keeps the correlation FastLip's interval arithmetic drops.

Write the row as g = w . a_{L-1}, a_l = relu(z_l), z_l = M_l a_{l-1} (M_l: the affine
segment between two activations, as a dense matrix), H_l = dg/da_l and lambda_l the ReLU
derivatives, each in {0}, {1} or [0, 1] from Fast-Lin's bounds of z_l (as FastLip). Then
H_{l-1} = M_l^T (lambda_l * H_l), and H_0 is the gradient.

Any functional v . (lambda_l * H_l) is bounded above term by term: where H_l,m's sign is
known (from its bounds) or lambda_l,m is fixed, the term is at most c_m H_l,m with
c_m = v_m * (the derivative end that maximises it), and sum_m c_m H_l,m = (M_{l+1} c) .
(lambda_{l+1} * H_{l+1}) is bounded by the same recursion one level up; where neither is
known, by the corners of [lambda] x [H bounds]. At the top, H_{L-1} = w exactly. The H
bounds of each level come from this recursion with v = a column of M_{l+1}, top-down, and
the gradient's from v = a column of M_1.

Each step is at most FastLip's interval step on the same boxes (the recursion's bound of
a sum is at most the sum of the terms' interval bounds, by induction from the exact top),
so RecurJac's G <= FastLip's G elementwise: ``tighter_than = ("fastlip",)``.
"""

from __future__ import annotations

import torch

from aisafety.verification import bounds as b
from aisafety.verification.base import Verifier
from aisafety.verification.dense import affine_segments
from aisafety.verification.graph import BoundGraph
from aisafety.verification.lipschitz import SEQUENTIAL_KINDS, centre_rows
from aisafety.verification.lipschitz_rounding import gradient_error, lower
from aisafety.verification.property import Property


class RecurJacVerifier(Verifier):
    name = "recurjac"
    description = (
        "RecurJac (Zhang et al. 2019): the row at the centre minus the Jacobian's elementwise "
        "bound over the box by a recursion over the layers (FastLip's derivative sets, "
        "tighter than its interval arithmetic) times the radius; sequential ReLU networks"
    )
    kinds = SEQUENTIAL_KINDS
    tighter_than = ("fastlip", "op-norm")

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        graph.require_sequential(self.name)

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        """One sample at a time: a level's functionals, (rows, inputs, widest layer) in
        float64, with the four corners and the pushed-up copy beside them."""
        widest = max(int(torch.Size(op.out_shape).numel()) for op in graph.ops)
        inputs = int(torch.Size(graph.input_shape).numel())
        return 8 * 8 * rows * inputs * widest + super().peak_bytes(graph, 1, rows)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        self.require_float64(graph, prop)
        value, radius = centre_rows(graph, prop)
        levels = sum(op.kind == "activation" for op in graph.ops)
        error = gradient_error(graph, prop.spec.to(graph.dtype), doublings=levels + 1)
        return lower(value, recurjac_bound(graph, prop) + error, radius), None


def recurjac_bound(graph: BoundGraph, prop: Property) -> torch.Tensor:
    """G >= |d row / d x| elementwise on the box, (B, K, *input); one sample at a time
    (the functionals of a level are (K, inputs, neurons) per sample)."""
    maps, cuts = affine_segments(graph)
    matrices = [m for m, _ in maps]
    if not cuts:  # affine: the gradient is the row itself
        grad = prop.spec.to(graph.dtype).flatten(2) @ matrices[0]
        return grad.abs().reshape(*grad.shape[:2], *graph.input_shape)
    boxes = b.linear_boxes(graph, prop.lower, prop.upper, "parallel")
    spec = prop.spec.to(graph.dtype)
    found = []
    for s in range(len(prop)):
        top = spec[s].reshape(spec.shape[1], -1) @ matrices[-1]  # (K, n): H of the last
        slopes = []
        for i in cuts:
            low, high = (t[s].flatten() for t in boxes[graph.ops[i].inputs[0]])
            slopes.append(((low >= 0).to(low.dtype), (high > 0).to(low.dtype)))
        found.append(Recursion(matrices, slopes, top).gradient_bound())
    grad = torch.stack(found)
    return grad.reshape(*grad.shape[:2], *graph.input_shape)


class Recursion:
    """The bounds of H at every level of one sample, top-down (``h_bounds[j]``: dg/da_j's
    bounds, (K, n_j); the last level is exact)."""

    def __init__(self, matrices: list[torch.Tensor], slopes, top: torch.Tensor):
        self.matrices, self.slopes, self.top = matrices, slopes, top
        self.h_bounds = [None] * (len(slopes) - 1) + [(top, top)]

    def gradient_bound(self) -> torch.Tensor:
        """(K, inputs): max |dg/dx_r| over the box, after every level's H bounds."""
        for level in range(len(self.slopes) - 1, -1, -1):
            columns = self.matrices[level].T.expand(len(self.top), -1, -1)  # (K, P, n_level)
            hi = self.upper(columns, level)
            lo = -self.upper(-columns, level)
            if level == 0:
                return torch.maximum(lo.abs(), hi.abs())
            self.h_bounds[level - 1] = (lo, hi)
        raise AssertionError("unreachable")

    def upper(self, v: torch.Tensor, level: int) -> torch.Tensor:
        """An upper bound of v . (lambda_level * H_level) for each functional v, (K, P)."""
        lam_lo, lam_hi = self.slopes[level]
        h_lo, h_hi = (t.unsqueeze(1) for t in self.h_bounds[level])  # (K, 1, n)
        positive, negative = h_lo >= 0, h_hi <= 0
        known = positive | negative | (lam_lo == lam_hi)
        # the derivative end maximising v_m lambda H_m given H_m's sign
        take_hi = torch.where(positive, v > 0, v < 0)
        c = torch.where(known, v * torch.where(take_hi, lam_hi, lam_lo), 0.0)
        corners = torch.stack([v * lam * h for lam in (lam_lo, lam_hi) for h in (h_lo, h_hi)])
        loose = torch.where(known, 0.0, corners.amax(0)).sum(-1)
        if level == len(self.slopes) - 1:
            return loose + (c * self.top.unsqueeze(1)).sum(-1)
        return loose + self.upper(c @ self.matrices[level + 1].T, level + 1)
