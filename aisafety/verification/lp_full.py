"""LP-Full (Salman et al. 2019): every bound from the LP over the triangle relaxation.

Layer by layer, each unstable ReLU's input is minimised and maximised by a linear program:
the network up to it with every earlier unstable ReLU replaced by its triangle (Ehlers
2017; ``milp.encode(relax=True)``) on the bounds already found; then each spec row is
minimised by the LP of the whole network. This is the tightest bound any single-neuron
linear relaxation gives (the "convex relaxation barrier": CROWN, Fast-Lin, DeepPoly and
the dual network are feasible points of this LP's dual), at one LP per bound.

Intermediate bounds start from CROWN's boxes and are intersected with them and with IBP's:
both are sound and the LP's optimum is never below them, so this changes the cost (fewer
unstable neurons to solve for), not the result. The spec rows' bounds are the LP optima
alone, so CROWN <= LP-Full is a checked result (the contract's ``tighter_than``), not a
construction. Each bound is not HiGHS's reported optimum but the safe bound from its
duals (``safe_dual.py``: proved for the LP as encoded, whatever HiGHS's tolerances), then
moved outwards by ``refine.SAFETY`` for the encoding's own float64 rounding (argued, not
proved: docs/certification.md); an LP HiGHS does not solve to optimality keeps the bound
it had. ReLU networks only, as the paper.
"""

from __future__ import annotations

import highspy
import numpy as np
import torch

from aisafety.verification import bounds as b
from aisafety.verification.base import Verifier
from aisafety.verification.deadline import check_time, current_deadline
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.ibp_rounding import U64
from aisafety.verification.incomplete import CrownVerifier
from aisafety.verification.milp import HIGHS_OPTIONS, Encoding, encode, encoding_bytes, new_highs
from aisafety.verification.ops import Box
from aisafety.verification.property import Property
from aisafety.verification.refine import SAFETY
from aisafety.verification.safe_dual import SafeLP, objective


class LinearPrograms:
    """One HiGHS model of an LP relaxation whose objective changes between solves (each
    solve starts from the last basis: warm, where a fresh model would start cold)."""

    def __init__(self, enc: Encoding):
        self.enc = enc
        self.highs = new_highs()
        for key, value in HIGHS_OPTIONS.items():
            self.highs.setOptionValue(key, value)
        self.highs.passModel(enc.highs_lp(np.zeros(enc.n_vars)))
        self.columns = np.arange(enc.n_vars, dtype=np.int32)
        self.safe = SafeLP(*enc.stacked(), enc.lower, enc.upper)
        self.abs_out = np.abs(enc.out_matrix)

    def minimum(self, output: np.ndarray, offset: float) -> float:
        """A sound lower bound of ``output . f + offset`` over the LP (-inf if unsolved)."""
        check_time()
        cost, cost_error, constant, constant_error = objective(
            self.enc.out_matrix, self.enc.out_const, output, offset, self.abs_out
        )
        self.highs.changeColsCost(len(cost), self.columns, cost.astype(np.float64))
        deadline = current_deadline()
        # (on the CPU clock the wall limit is a backstop: a loaded machine stopped LPs early,
        # silently loosening bounds, measured on sok-fcnn-b-adv1 at load 18)
        limit = deadline.wall_seconds() if deadline is not None else highspy.kHighsInf
        self.highs.setOptionValue("time_limit", float(limit))
        self.highs.run()
        check_time()
        if self.highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return float("-inf")
        duals = np.asarray(self.highs.getSolution().row_dual)
        found = self.safe.bound(cost, duals, cost_error)
        # the two additions round by at most u of their operands' sizes each
        sums = 4 * U64 * (abs(found) + abs(constant) + constant_error)
        value = float(np.nextafter(found + constant - constant_error - sums, -np.inf))
        return value - SAFETY * (1 + abs(value))


def lp_full_boxes(graph: BoundGraph, boxes: list[Box]) -> list[Box]:
    """``boxes`` (batch of one) with every unstable ReLU's input bounded by the LP."""
    boxes = list(boxes)
    deep = b.depends_on_activation(graph)
    for op in graph.ops:
        if op.kind != "activation" or not deep[op.inputs[0]]:
            continue  # IBP is exact on an affine function of the input
        j = op.inputs[0]
        boxes[j] = _tighten_node(graph, boxes, j)
        boxes = b.forward_from(graph, boxes, j)
    return boxes


def _tighten_node(graph: BoundGraph, boxes: list[Box], j: int) -> Box:
    lo, hi = (t.flatten().clone() for t in boxes[j])
    unstable = torch.nonzero((lo < 0) & (hi > 0)).flatten().tolist()
    if not unstable:
        return boxes[j]
    prefix = BoundGraph(graph.ops[: j + 1], graph.model, graph.dtype)
    programs = LinearPrograms(encode(prefix, boxes[: j + 1], relax=True))
    unit = np.eye(len(lo))
    for u in unstable:
        lo[u] = max(float(lo[u]), programs.minimum(unit[u], 0.0))
        hi[u] = min(float(hi[u]), -programs.minimum(-unit[u], 0.0))
    return lo.reshape(boxes[j][0].shape), hi.reshape(boxes[j][1].shape)


class LPFullVerifier(Verifier):
    name = "lp-full"
    description = (
        "LP-Full (Salman et al. 2019): every unstable ReLU's input bounds and every spec "
        "row from an LP over the triangle relaxation (HiGHS); ReLU networks"
    )
    kinds = b.CROWN_KINDS  # max-pooling: ``milp_maxpool.py``'s LP rows
    # the dual of its LP has these bounds as feasible points (on looser boxes)
    tighter_than = ("crown", "fast-lin", "deeppoly", "wk", "crown-ibp", "ibp")

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        """CROWN's boxes (its peak), then one sample's LP encoding at a time."""
        return CrownVerifier().peak_bytes(graph, batch, rows) + encoding_bytes(graph)

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        if not graph.relu_only:
            raise VerificationError(
                f"verifier {self.name!r} needs a ReLU network; model {graph.model!r} has sigmoid "
                "or tanh activations (use 'alpha-crown' or 'crown', which bound them)"
            )

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        """Each row's LP optimum (CROWN's bound where HiGHS does not reach optimality)."""
        self.require_float64(graph, prop)
        crown = b.linear_boxes(graph, prop.lower, prop.upper)
        bound, _ = b.spec_lower(graph, crown, prop.spec)
        for s in range(len(prop)):
            boxes = lp_full_boxes(graph, [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in crown])
            programs = LinearPrograms(encode(graph, boxes, relax=True))
            for k, row in enumerate(prop.spec[s].double().cpu().numpy()):
                value = programs.minimum(row, 0.0)
                if np.isfinite(value):
                    bound[s, k] = value
        return bound, None
