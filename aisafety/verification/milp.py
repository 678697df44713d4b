"""The complete verifier: a mixed-integer program per sample, solved by HiGHS through scipy.

ReLU networks are piecewise linear, so "min of a spec row over the box" is a MILP (Tjeng
et al. 2019): every unstable ReLU a = max(z, 0) with l < 0 < u gets a binary d and

    a >= 0,  a >= z,  a <= u d,  a <= z - l (1 - d)

where [l, u] are sound bounds of z (here alpha-CROWN's, intersected with IBP's). Stable
ReLUs are exact (a = z or a = 0). Every node is kept as an affine expression of the MILP
variables (the input pixels and the unstable ReLU outputs), so convolutions, reshapes,
normalisation and residual additions need no variables of their own.

Per sample: alpha-CROWN first (certifies the easy ones), then a box-PGD for a
counterexample, then one MILP per remaining spec row, weakest bound first, under the
sample's time limit. A row whose optimum (or HiGHS's dual bound at the limit) is > 0 is
proved; an optimum <= 0 gives a point that is replayed through the predictor. With
``relax=True`` the binaries become [0, 1]: the triangle LP relaxation (Ehlers 2017).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_matrix, vstack

from aisafety.verification import bounds as b
from aisafety.verification.base import VerifierConfig
from aisafety.verification.falsify import Model, pgd_on_rows, replay
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.incomplete import AlphaCrownVerifier
from aisafety.verification.ops import Box
from aisafety.verification.property import Property
from aisafety.verification.result import Verdict, VerificationResult


@dataclass
class Encoding:
    """The constraints of one sample: variables are [inputs, relu outputs, binaries]."""

    n_vars: int
    lower: np.ndarray
    upper: np.ndarray
    integrality: np.ndarray
    rows: list[csr_matrix]
    row_lower: list[np.ndarray]
    row_upper: list[np.ndarray]
    out_matrix: np.ndarray  # (n_vars, outputs): output = vars @ out_matrix + out_const
    out_const: np.ndarray
    n_inputs: int

    def constraints(self) -> list[LinearConstraint]:
        if not self.rows:
            return []
        matrix = vstack(self.rows).tocsr()
        return [LinearConstraint(matrix, np.concatenate(self.row_lower),
                                 np.concatenate(self.row_upper))]  # fmt: skip


def encode(graph: BoundGraph, boxes: list[Box], relax: bool = False) -> Encoding:
    """The MILP (or LP with ``relax``) of one sample (boxes of batch size 1)."""
    graph.require({"input", "dense", "conv", "elementwise", "reshape", "positive-linear", "add",
                   "activation"}, "the complete verifier")  # fmt: skip
    if not graph.relu_only:
        raise VerificationError(
            f"the complete verifier needs a ReLU network; model {graph.model!r} has sigmoid or "
            "tanh activations (use 'alpha-crown' or 'crown', which bound them)"
        )
    lo_in, hi_in = (t[0].flatten().double().numpy() for t in boxes[0])
    n_in = lo_in.size
    # count variables first: one output and one binary per unstable neuron
    unstable = {}
    n_vars = n_in
    for i, op in enumerate(graph.ops):
        if op.kind == "activation":
            lo, hi = (t[0].flatten() for t in boxes[op.inputs[0]])
            mask = ((lo < 0) & (hi > 0)).numpy()
            unstable[i] = (mask, lo.double().numpy(), hi.double().numpy(), n_vars, int(mask.sum()))
            n_vars += 2 * int(mask.sum())
    lower, upper = np.zeros(n_vars), np.zeros(n_vars)
    lower[:n_in], upper[:n_in] = lo_in, hi_in
    integrality = np.zeros(n_vars)
    rows, row_lo, row_hi = [], [], []
    exprs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (n_vars, *shape), (*shape)
    eye = torch.zeros(n_vars, n_in, dtype=torch.float64)
    eye[torch.arange(n_in), torch.arange(n_in)] = 1.0
    exprs.append(
        (
            eye.reshape(n_vars, *graph.input_shape),
            torch.zeros(graph.input_shape, dtype=torch.float64),
        )
    )
    for i, op in enumerate(graph.ops[1:], start=1):
        ins = [exprs[j] for j in op.inputs]
        if op.kind == "add":
            exprs.append((ins[0][0] + ins[1][0], ins[0][1] + ins[1][1]))
            continue
        if op.kind != "activation":
            matrix, const = ins[0]
            zero = op.forward(torch.zeros(1, *const.shape, dtype=torch.float64))[0]
            exprs.append((op.forward(matrix) - zero, op.forward(const.unsqueeze(0))[0]))
            continue
        mask, lo, hi, first, count = unstable[i]
        matrix, const = ins[0][0].reshape(n_vars, -1), ins[0][1].flatten()
        active = torch.from_numpy(lo >= 0)
        out_matrix = matrix * active
        out_const = const * active
        idx = np.flatnonzero(mask)
        a_vars = first + np.arange(count)
        d_vars = first + count + np.arange(count)
        out_matrix[:, idx] = 0.0
        out_matrix[a_vars, idx] = 1.0
        out_const[idx] = 0.0
        upper[a_vars], upper[d_vars] = hi[idx], 1.0
        integrality[d_vars] = 0 if relax else 1
        z = matrix[:, idx].numpy().T  # (count, n_vars): z = z @ vars + c
        c = const[idx].numpy()
        sel_a = csr_matrix((np.ones(count), (np.arange(count), a_vars)), shape=(count, n_vars))
        sel_d = csr_matrix((np.ones(count), (np.arange(count), d_vars)), shape=(count, n_vars))
        z = csr_matrix(z)
        # a - z >= c ; a - u d <= 0 ; a - z - l d <= c - l
        rows += [sel_a - z, sel_a - sel_d.multiply(hi[idx][:, None]),
                 sel_a - z - sel_d.multiply(lo[idx][:, None])]  # fmt: skip
        row_lo += [c, np.full(count, -np.inf), np.full(count, -np.inf)]
        row_hi += [np.full(count, np.inf), np.zeros(count), c - lo[idx]]
        shape = ins[0][1].shape
        exprs.append((out_matrix.reshape(n_vars, *shape), out_const.reshape(shape)))
    out_matrix, out_const = exprs[-1]
    flat_out = out_matrix.reshape(n_vars, -1).numpy()
    return Encoding(n_vars, lower, upper, integrality, rows, row_lo, row_hi,
                    flat_out, out_const.flatten().numpy(), n_in)  # fmt: skip


def minimise_row(
    enc: Encoding, row: np.ndarray, offset: float, time_limit: float
) -> tuple[float, float, np.ndarray | None]:
    """(lower bound proved, best value found, its input point or None) of ``row . f + offset``."""
    cost = enc.out_matrix @ row
    const = float(enc.out_const @ row + offset)
    result = milp(
        cost, integrality=enc.integrality, bounds=Bounds(enc.lower, enc.upper),
        constraints=enc.constraints(), options={"time_limit": max(time_limit, 0.01), "disp": False},
    )  # fmt: skip
    if result.x is None:
        if result.status == 2:  # infeasible box: the property holds vacuously
            return float("inf"), float("inf"), None
        return float("-inf"), float("inf"), None
    value = float(result.fun) + const
    if result.status == 0:
        bound = value
    else:
        dual = getattr(result, "mip_dual_bound", None)
        bound = float(dual) + const if dual is not None and np.isfinite(dual) else float("-inf")
    return bound, value, result.x[: enc.n_inputs]


def decide_row(
    enc: Encoding, row: np.ndarray, offset: float, time_limit: float, tolerance: float = 1e-5
) -> tuple[float, float, np.ndarray | None]:
    """Like ``minimise_row`` but only decides the sign: a feasibility MILP for a point with
    ``row . f + offset <= tolerance``. Infeasible proves the row > ``tolerance`` (returned as
    the bound; the tolerance also absorbs HiGHS's feasibility tolerance); HiGHS stops at the
    first feasible point, which is usually far faster than proving the optimum."""
    cost = enc.out_matrix @ row
    const = float(enc.out_const @ row + offset)
    cut = LinearConstraint(csr_matrix(cost[None]), -np.inf, tolerance - const)
    result = milp(
        np.zeros_like(cost), integrality=enc.integrality, bounds=Bounds(enc.lower, enc.upper),
        constraints=[*enc.constraints(), cut],
        options={"time_limit": max(time_limit, 0.01), "disp": False},
    )  # fmt: skip
    if result.status == 2:
        return tolerance, float("inf"), None
    if result.x is None:
        return float("-inf"), float("inf"), None
    return float("-inf"), float(cost @ result.x + const), result.x[: enc.n_inputs]


class CompleteConfig(VerifierConfig):
    batch_size: int = Field(default=16, gt=0)
    attack_steps: int = Field(default=50, ge=0, description="box-PGD steps before the MILP")
    alpha_steps: int = Field(default=20, ge=0, description="alpha-CROWN steps for the bounds")
    exact: bool = Field(
        default=False,
        description="minimise each row to optimality (exact margins) instead of deciding its sign",
    )


class CompleteVerifier(AlphaCrownVerifier):
    name = "complete"
    description = (
        "alpha-CROWN, box-PGD, then an exact MILP (HiGHS via scipy) per spec row; ReLU "
        "networks; settles every sample given time"
    )
    complete = True
    Config = CompleteConfig

    def boxes(self, graph: BoundGraph, prop: Property):
        """alpha-CROWN intermediate bounds: fewer unstable ReLUs, tighter big-M constants."""
        steps = self.config.alpha_steps
        return b.linear_boxes(graph, prop.lower, prop.upper, "adaptive", steps)

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        if not graph.relu_only:
            raise VerificationError(
                f"verifier 'complete' needs a ReLU network; model {graph.model!r} has sigmoid "
                "or tanh activations (use 'alpha-crown' or 'crown', which bound them)"
            )

    def _verify_batch(self, graph: BoundGraph, prop: Property, model: Model) -> VerificationResult:
        began = time.perf_counter()
        prop = prop.to(graph.dtype)
        with torch.no_grad():
            boxes = self.boxes(graph, prop)
            bound, coeff = b.optimise_slopes(graph, boxes, prop.spec, self.config.alpha_steps, 0.1)
            bound = torch.maximum(bound, b.ibp_spec_lower(graph, boxes, prop.spec)) + prop.offset
        shared = (time.perf_counter() - began) / len(prop)
        attack = pgd_on_rows(
            lambda x: graph.forward(x.to(graph.dtype)), prop, self.config.attack_steps
        )
        attacked = replay(model, prop, attack)
        verdicts, margins, seconds, notes = [], [], [], []
        counter = torch.full_like(prop.lower, float("nan"), dtype=torch.float32)
        for s in range(len(prop)):
            start = time.perf_counter()
            sample_boxes = [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in boxes]
            verdict, margin, point, note = self._one(
                graph, prop[s : s + 1], sample_boxes, bound[s], attacked[s], attack[s], model, start
            )
            if point is not None:
                counter[s] = point
            verdicts.append(verdict)
            notes.append(note)
            margins.append(margin)
            seconds.append(time.perf_counter() - start + shared)
        return VerificationResult(self.name, verdicts, torch.tensor(margins, dtype=torch.float32),
                                  torch.tensor(seconds), counter, notes)  # fmt: skip

    def _one(self, graph, prop, boxes, bound, attacked, attack_point, model, start):
        """One sample: (verdict, margin, counterexample or None, why unknown)."""
        if bound.min() > 0:
            return Verdict.CERTIFIED, float(bound.min()), None, ""
        if attacked:
            with torch.no_grad():
                value = prop.rows(model(attack_point[None].float()).double()).min()
            return Verdict.FALSIFIED, float(value), attack_point.float(), ""
        enc = encode(graph, boxes)
        proved = bound.clone()
        for k in torch.argsort(bound).tolist():
            if proved[k] > 0:
                continue
            left = self.config.timeout - (time.perf_counter() - start)
            if left <= 0:
                return Verdict.UNKNOWN, float(proved.min()), None, "timeout"
            row = prop.spec[0, k].numpy()
            solve = minimise_row if self.config.exact else decide_row
            low, value, point = solve(enc, row, float(prop.offset[0, k]), left)
            proved[k] = max(float(proved[k]), low)
            if point is not None and value <= 0:
                candidate = torch.from_numpy(point).reshape(prop.lower.shape)
                if replay(model, prop, candidate)[0]:
                    return Verdict.FALSIFIED, value, candidate.float()[0], ""
            if proved[k] <= 0:
                why = "timeout" if point is None or value > 0 else "MILP point did not replay"
                return Verdict.UNKNOWN, float(proved.min()), None, why
        return Verdict.CERTIFIED, float(proved.min()), None, ""
