"""Branch and bound over sigmoid and tanh neurons (GenBaB-style, Shi et al. 2024): domains,
their bounds, the branching score and the split.

A domain is one spec row of one sample with its own box for every node: the root's boxes
(sound on the whole input box) with some activation inputs cut to a sub-interval, and IBP
re-run after each cut and intersected. Splitting a neuron z with box [l, u] at t (0 when
l < 0 < u, as GenBaB does, else the middle) gives the children z <= t and z >= t, which
cover the parent. On each child the S-shape relaxation is recomputed on the cut interval
(``SShapeRelaxation``: exact intercepts for any slope, so tighter lines on a narrower
interval), and every later box can only shrink.

A domain's bound is alpha-CROWN (Adam on one lower and one upper slope per neuron,
resumed from its parent's, then a rounding-safe pass) on the domain's boxes. Every box holds
every value its node takes at the points of the input box that satisfy the domain's cuts,
so the bound is a lower bound of the row on those points. No Lagrange multiplier (beta)
is used: the cuts act through the boxes only (docs/certification.md says why).

Branching score: per neuron, the vertical width of the relaxation's band at the chord's
slope (max minus min of f(z) - k z on [l, u]) times ``|A|``, the coefficient the row's
backward pass gives the neuron's output: how much bound the neuron's relaxation can cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aisafety.verification.bounds import forward_from, search_slopes, sound_backward
from aisafety.verification.deadline import check_time
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.relaxations import SShapeRelaxation

# an interval narrower than this (relative to 1 + its ends) is not split again
MIN_WIDTH = 1e-6


@dataclass
class SDomains:
    """D domains of one sample: row spec (D, outputs), offset (D,), the row's index (D,),
    every node's box (D, *shape), the last bound (D,) and the (node, index) to split next
    (D, 2; node -1: nothing left to split)."""

    spec: torch.Tensor
    offset: torch.Tensor
    row: torch.Tensor
    boxes: list[Box]
    bound: torch.Tensor
    branch: torch.Tensor | None = None
    alpha: dict[int, torch.Tensor] | None = None  # last slopes per node (D, 1, 2, *shape)

    def __len__(self) -> int:
        return len(self.offset)

    def take(self, index: torch.Tensor) -> SDomains:
        boxes = [(lo[index], hi[index]) for lo, hi in self.boxes]
        branch = None if self.branch is None else self.branch[index]
        alpha = None if self.alpha is None else {i: t[index] for i, t in self.alpha.items()}
        return SDomains(self.spec[index], self.offset[index], self.row[index], boxes,
                        self.bound[index], branch, alpha)  # fmt: skip

    @staticmethod
    def cat(parts: list[SDomains]) -> SDomains:
        parts = [p for p in parts if len(p)]
        boxes = [(torch.cat([p.boxes[n][0] for p in parts]),
                  torch.cat([p.boxes[n][1] for p in parts]))
                 for n in range(len(parts[0].boxes))]  # fmt: skip
        branch = None if any(p.branch is None for p in parts) \
            else torch.cat([p.branch for p in parts])  # fmt: skip
        alpha = None if any(p.alpha is None for p in parts) \
            else {i: torch.cat([p.alpha[i] for p in parts]) for i in parts[0].alpha}  # fmt: skip
        return SDomains(*(torch.cat([getattr(p, k) for p in parts])
                          for k in ("spec", "offset", "row")), boxes,
                        torch.cat([p.bound for p in parts]), branch, alpha)  # fmt: skip

    def nbytes(self, graph: BoundGraph) -> int:
        """Bytes per domain: its boxes, its row and its two float32 slopes per S-shape
        neuron (``alpha``, once bounded)."""
        per = sum(lo[0].numel() * lo.element_size() * 2 for lo, _ in self.boxes)
        slopes = sum(2 * 4 * self.boxes[graph.ops[i].inputs[0]][0][0].numel()
                     for i in sshape_nodes(graph))  # fmt: skip
        return per + slopes + self.spec[0].numel() * self.spec.element_size()


def sshape_nodes(graph: BoundGraph) -> list[int]:
    """Indices of the sigmoid and tanh ops, in graph order."""
    return [i for i, op in enumerate(graph.ops)
            if op.kind == "activation" and isinstance(op.relaxation, SShapeRelaxation)]  # fmt: skip


def root_sdomains(root: list[Box], spec, offset, rows) -> SDomains:
    """One domain per open row (spec (K, outputs), offset (K,)) on the root's boxes."""
    k = len(offset)
    boxes = [(lo.expand(k, *lo.shape[1:]), hi.expand(k, *hi.shape[1:])) for lo, hi in root]
    return SDomains(spec, offset, torch.as_tensor(rows), boxes,
                    torch.full((k,), -torch.inf, dtype=offset.dtype))  # fmt: skip


def bound_sdomains(graph: BoundGraph, d: SDomains, steps: int, lr: float):
    """Each domain's sound lower bound (D,) by alpha-CROWN on its own boxes: ``steps`` of
    Adam (``lr``) from the domain's last slopes (its parent's; the chord's at the root),
    then the sound pass, CROWN's bound kept where higher. Sets ``d.alpha`` to the slopes
    found. Also its input coefficients (D, *in) and the coefficients at each S-shape
    activation's output (by node; CROWN's chord pass), for branching."""
    a = d.spec.reshape(len(d), 1, *graph.ops[-1].out_shape).to(graph.dtype)
    end = len(graph.ops) - 1
    bound, coeff = sound_backward(graph, end, a, d.boxes)
    chosen = search_slopes(graph, end, a, d.boxes, steps, lr, init=d.alpha)
    if chosen:
        slopes = {i: t.to(graph.dtype) for i, t in chosen.items()}
        with torch.no_grad():
            now, now_coeff = sound_backward(graph, end, a, d.boxes, slopes=slopes)
        better = now > bound
        coeff = torch.where(better.reshape(*better.shape, *[1] * (coeff.dim() - 2)),
                            now_coeff, coeff)  # fmt: skip
        bound = torch.maximum(bound, now)
        d.alpha = chosen
    return bound[:, 0] + d.offset, coeff[:, 0], activation_coefficients(graph, a, d.boxes)


def activation_coefficients(graph: BoundGraph, a: torch.Tensor, boxes: list[Box]):
    """The coefficient (D, 1, *shape) reaching each S-shape activation's output in CROWN's
    backward pass of the rows ``a`` (D, 1, *out); only to rank neurons, never to bound."""
    wanted = set(sshape_nodes(graph))
    pending, out = {len(graph.ops) - 1: a}, {}
    with torch.no_grad():
        for i in range(len(graph.ops) - 1, 0, -1):
            if i not in pending:
                continue
            check_time()
            op, c = graph.ops[i], pending.pop(i)
            if i in wanted:
                out[i] = c
            back, _ = op.backward(c, *(boxes[j] for j in op.inputs))
            for j, part in zip(op.inputs, back, strict=True):
                pending[j] = part if j not in pending else pending[j] + part
    return out


def branch_scores(graph: BoundGraph, d: SDomains, at_act: dict[int, torch.Tensor]):
    """Per domain, (node, index) of the neuron with the best score (module docstring), and
    the score (D,); node -1 where every neuron is too narrow to split."""
    best = torch.full((len(d),), -1.0, dtype=torch.float64)
    node = torch.full((len(d),), -1, dtype=torch.long)
    index = torch.zeros(len(d), dtype=torch.long)
    for i in sshape_nodes(graph):
        op = graph.ops[i]
        lo, hi = (t.reshape(len(d), -1).double() for t in d.boxes[op.inputs[0]])
        relax = op.relaxation
        low, high = relax.gaps(lo, hi, relax.chord(lo, hi))
        a = at_act[i].reshape(len(d), -1).double().abs()
        wide = (hi - lo) > MIN_WIDTH * (1 + lo.abs() + hi.abs())
        score = torch.where(wide, a * (high - low) + 1e-12, -1.0)
        value, where = score.max(1)
        better = value > best
        best = torch.where(better, value, best)
        node = torch.where(better, i, node)
        index = torch.where(better, where, index)
    node = torch.where(best > 0, node, -1)
    return node, index, best


def split_point(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """0 where the interval holds 0 inside (the curvature changes sign there), else the
    middle."""
    return torch.where((lo < 0) & (hi > 0), torch.zeros_like(lo), (lo + hi) / 2)


def split_sdomains(graph: BoundGraph, d: SDomains) -> SDomains:
    """Two children per domain (first all the ``z <= t`` halves, then all the ``z >= t``):
    the neuron ``d.branch`` names, its input box cut at ``split_point``, IBP re-run after
    it and intersected. Every domain must name a node (>= 0)."""
    n = len(d)
    node, index = d.branch[:, 0], d.branch[:, 1]
    kids = SDomains.cat([d, d])
    kids.branch = None
    boxes = [(lo.clone(), hi.clone()) for lo, hi in kids.boxes]
    rows = torch.arange(n)
    for i in torch.unique(node).tolist():
        j = graph.ops[i].inputs[0]
        mine = rows[node == i]
        lo, hi = (t.reshape(2 * n, -1) for t in boxes[j])
        at = index[mine]
        t = split_point(lo[mine, at], hi[mine, at])
        hi[mine, at] = torch.minimum(hi[mine, at], t)
        lo[n + mine, at] = torch.maximum(lo[n + mine, at], t)
    first = min(graph.ops[i].inputs[0] for i in torch.unique(node).tolist())
    kids.boxes = forward_from(graph, boxes, first)
    kids.bound = d.bound.repeat(2)
    return kids
