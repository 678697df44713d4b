"""Tighter intermediate bounds for the complete verifier: each unstable ReLU's input
minimised and maximised by a MILP over the network up to it (Tjeng et al. 2019's
progressive bound tightening; alpha-beta-CROWN refines MNIST-FC bounds the same way).

The MILP's big-M constants are those bounds, so every neuron proved stable drops a binary
and every tighter one cuts the relaxation: on vnncomp2021 mnistfc prop_5_0.03 (256x2),
refining the second layer raised alpha-CROWN's worst row bound from -0.63 to -0.19.

Layers are refined in order, so a deeper layer's MILPs use the refined boxes before it;
within a layer the neurons with the loosest relaxation (largest triangle, -l u / (u - l))
come first, each under ``neuron_time`` seconds, all before ``deadline``. A MILP stopped by
its limit still gives HiGHS's dual bound.

What a refined bound rests on (docs/certification.md, "refine.py's MILP bounds"): HiGHS's
MIP dual bound, which holds within its tolerances at every node of its tree (not exposed,
so no safe bound can be formed, as for ``complete``'s MILP rows), moved out by ``SAFETY``.
Against exact extremes in rationals (``bench/refine_slack.py``, 641 bounds on small nets)
HiGHS's bound was above on 28%, by at most 3e-14 (its rounding), and below once moved by
``SAFETY``: needed, but a tolerance, not a proof. So ``refine_boxes`` says whether it
tightened any box, and ``complete`` notes a certificate on such boxes (``REFINED_NOTE``).
"""

from __future__ import annotations

import numpy as np
import torch

from aisafety.verification.bounds import depends_on_activation, forward_from
from aisafety.verification.deadline import Deadline
from aisafety.verification.graph import BoundGraph
from aisafety.verification.milp import encode, solve
from aisafety.verification.ops import Box

# HiGHS answers within its tolerances (1e-7 per row, relative gaps): a refined bound is
# moved this far outwards before it is used
SAFETY = 1e-5

# a bound needs only a little precision: stop a neuron's MILP at 1% gap
REFINE_OPTIONS = {"mip_rel_gap": 0.01, "mip_abs_gap": 1e-4}


def refine_boxes(
    graph: BoundGraph, boxes: list[Box], deadline: Deadline, neuron_time: float
) -> tuple[list[Box], bool]:
    """``boxes`` (batch of one) with the unstable ReLU inputs tightened by MILP, and
    whether any was (then the boxes rest on HiGHS's MIP bounds, not on a proof)."""
    boxes = list(boxes)
    deep = depends_on_activation(graph)
    tightened = False
    for op in graph.ops:
        if op.kind != "activation" or not deep[op.inputs[0]]:
            continue  # IBP is exact on an affine function of the input
        j = op.inputs[0]
        if deadline.passed():
            break
        before = boxes[j]
        boxes[j] = _refine_node(graph, boxes, j, deadline, neuron_time)
        tightened |= not all(torch.equal(a, b) for a, b in zip(before, boxes[j], strict=True))
        boxes = forward_from(graph, boxes, j)
    return boxes, tightened


def _refine_node(
    graph: BoundGraph, boxes: list[Box], j: int, deadline: Deadline, neuron_time: float
) -> Box:
    lo, hi = (t.flatten().clone() for t in boxes[j])
    unstable = torch.nonzero((lo < 0) & (hi > 0)).flatten()
    if len(unstable) == 0:
        return boxes[j]
    enc = encode(BoundGraph(graph.ops[: j + 1], graph.model, graph.dtype), boxes[: j + 1])
    area = -lo[unstable] * hi[unstable] / (hi[unstable] - lo[unstable])
    for u in unstable[torch.argsort(area, descending=True)].tolist():
        for sign in (1.0, -1.0):  # min z_u, then min -z_u = -max z_u
            left = min(neuron_time, deadline.left())
            if left <= 0:
                return lo.reshape(boxes[j][0].shape), hi.reshape(boxes[j][1].shape)
            found = solve(enc, sign * enc.out_matrix[:, u], sign * float(enc.out_const[u]), left,
                          options=REFINE_OPTIONS, stop=deadline.passed)  # fmt: skip
            if not np.isfinite(found.bound):
                continue
            bound = found.bound - SAFETY * (1 + abs(found.bound))
            if sign > 0:
                lo[u] = max(float(lo[u]), bound)
            else:
                hi[u] = min(float(hi[u]), -bound)
            if lo[u] >= 0 or hi[u] <= 0:
                break  # stable: the other side cannot change the encoding much
    return lo.reshape(boxes[j][0].shape), hi.reshape(boxes[j][1].shape)
