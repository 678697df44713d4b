"""K-ReLU (Singh et al. 2019, NeurIPS): LP-Full with, in every hidden layer, groups of k
unstable ReLUs relaxed jointly by their convex hull (``multi_neuron.py``).

Layer by layer, as LP-Full: each unstable ReLU's input is minimised and maximised by the
LP of the network before it, now with the groups of the earlier layers; then the layer's
groups are formed (its unstable neurons by triangle area, largest first, in consecutive
chunks of k, a last smaller one if it has two or more; at most ``groups`` of them), each
group's octahedral bounds are solved on the same LP, and its hull rows join every later
LP. Every spec row is minimised by the final LP. ERAN forms overlapping groups within
windows of ``ns`` neurons; disjoint chunks are our simplification (fewer rows per neuron,
so never tighter than overlapping groups on the same bounds).

Its LPs contain LP-Full's (same affine rows; a triangle on tighter bounds is a subset; the
hull projects into each triangle), so its bounds are never below LP-Full's (declared,
checked per sample by the contract and ``tests/test_orderings.py``), and never above the
exact MILP. Each bound is the safe dual bound from HiGHS's duals, then moved outwards by
``refine.SAFETY`` for the encoding's rounding, as LP-Full's (``lp_full.LinearPrograms``).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from aisafety.verification import bounds as b
from aisafety.verification.base import VerifierConfig
from aisafety.verification.graph import BoundGraph
from aisafety.verification.lp_full import LinearPrograms, LPFullVerifier
from aisafety.verification.milp import Encoding, encode
from aisafety.verification.multi_neuron import Group, directions
from aisafety.verification.ops import Box
from aisafety.verification.property import Property


class KReluConfig(VerifierConfig):
    k: int = Field(default=3, ge=2, le=4, description="ReLUs per group (the paper's k)")
    groups: int = Field(default=30, ge=0, description="groups per layer, loosest neurons first")


class KReluVerifier(LPFullVerifier):
    name = "k-relu"
    description = (
        "K-ReLU (Singh et al. 2019): LP-Full plus the convex hull of groups of k unstable "
        "ReLUs per layer over their octahedral input bounds (HiGHS); ReLU networks"
    )
    Config = KReluConfig
    tighter_than = ("lp-full",)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        """Each row's LP optimum (CROWN's bound where HiGHS does not reach optimality)."""
        self.require_float64(graph, prop)
        crown = b.linear_boxes(graph, prop.lower, prop.upper)
        bound, _ = b.spec_lower(graph, crown, prop.spec)
        for s in range(len(prop)):
            boxes, groups = self._layers(
                graph, [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in crown]
            )
            programs = LinearPrograms(with_groups(encode(graph, boxes, relax=True), groups))
            for k, row in enumerate(prop.spec[s].double().cpu().numpy()):
                value = programs.minimum(row, 0.0)
                if np.isfinite(value):
                    bound[s, k] = value
        return bound, None

    def _layers(self, graph: BoundGraph, boxes: list[Box]) -> tuple[list[Box], list[Group]]:
        """Every unstable ReLU input bounded by the LP with the earlier groups, and the
        groups of every layer."""
        groups: list[Group] = []
        deep = b.depends_on_activation(graph)
        for op in graph.ops:
            if op.kind != "activation":
                continue
            j = op.inputs[0]
            base = encode(BoundGraph(graph.ops[: j + 1], graph.model, graph.dtype),
                          boxes[: j + 1], relax=True)  # fmt: skip
            programs = LinearPrograms(with_groups(base, groups))
            if deep[j]:  # IBP is exact on an affine function of the input
                boxes[j] = tightened(programs, boxes[j])
                boxes = b.forward_from(graph, boxes, j)
            groups += self._groups(base, programs, boxes[j])
        return boxes, groups

    def _groups(self, base: Encoding, programs: LinearPrograms, box: Box) -> list[Group]:
        lo, hi = (t.flatten().double().numpy() for t in box)
        unstable = np.flatnonzero((lo < 0) & (hi > 0))
        rank = {int(u): r for r, u in enumerate(unstable)}  # its relu variable's position
        k = self.config.k
        area = -lo[unstable] * hi[unstable] / (hi[unstable] - lo[unstable])
        order = unstable[np.argsort(-area, kind="stable")]
        found = []
        chunks = [order[i : i + k] for i in range(0, len(order), k)]
        for idx in [c for c in chunks if len(c) >= 2][: self.config.groups]:
            m = len(idx)
            # delta_s = max s . z = -min (-s) . z
            delta = np.array([-programs.minimum(_direction(-s, idx, len(lo)), 0.0)
                              for s in directions(m)])  # fmt: skip
            a_vars = base.n_vars + np.array([rank[int(u)] for u in idx])
            found.append(Group(base.out_matrix[:, idx], base.out_const[idx], a_vars,
                               lo[idx], hi[idx], delta))  # fmt: skip
        return found


def _direction(s: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[idx] = s
    return out


def with_groups(enc: Encoding, groups: list[Group]) -> Encoding:
    for group in groups:
        enc = group.add_to(enc)
    return enc


def tightened(programs: LinearPrograms, box: Box) -> Box:
    """``box`` with each unstable neuron's bounds from the LP (kept where the LP is looser
    or unsolved)."""
    lo, hi = (t.flatten().clone() for t in box)
    unit = np.eye(len(lo))
    for u in torch.nonzero((lo < 0) & (hi > 0)).flatten().tolist():
        lo[u] = max(float(lo[u]), programs.minimum(unit[u], 0.0))
        hi[u] = min(float(hi[u]), -programs.minimum(-unit[u], 0.0))
    return lo.reshape(box[0].shape), hi.reshape(box[1].shape)
