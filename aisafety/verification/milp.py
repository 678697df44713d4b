"""The MILP of a ReLU network on a box, solved by HiGHS (highspy).

ReLU networks are piecewise linear, so "min of a spec row over the box" is a MILP (Tjeng
et al. 2019): every unstable ReLU a = max(z, 0) with l < 0 < u gets a binary d and

    a >= 0,  a >= z,  a <= u d,  a <= z - l (1 - d)

where [l, u] are sound bounds of z. Stable ReLUs are exact (a = z or a = 0). Every node is
kept as an affine expression of the MILP variables (the input pixels and the unstable ReLU
outputs), so convolutions, reshapes, normalisation and residual additions need no
variables of their own. Max-pooling gets a variable per window whose winner is not certain
and a binary per element that can still win (``milp_maxpool.py``). With ``relax=True`` the
binaries become [0, 1]: the triangle LP relaxation (Ehlers 2017), and max-pooling's rows.

HiGHS is called through highspy rather than scipy's ``milp``: it exposes the options that
decide the speed here (primal heuristics off, an objective cutoff that stops at the first
counterexample and prunes everything above it), and it is a newer HiGHS.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import highspy
import numpy as np
import torch

from aisafety.memory_budget import current_budget
from aisafety.verification import float32_rounding
from aisafety.verification.budget import numel, refuse
from aisafety.verification.deadline import check_time
from aisafety.verification.float64_margin import through
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.milp_maxpool import encode_pool, plan
from aisafety.verification.ops import Box

# scipy.optimize/sparse take ~0.4 s to import, and every process that builds the plugin
# registry imports this module (through the complete verifier): imported where used
if TYPE_CHECKING:
    from scipy.optimize import LinearConstraint
    from scipy.sparse import csr_matrix


@dataclass
class Encoding:
    """The constraints of one sample: variables are the inputs, then per ReLU or max-pool
    node (graph order) its output variables and binaries."""

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
    # float32: rigorous: the float32 output is within this of the expression (``_f32_error``)
    out_error: np.ndarray | None = None

    def lowest(self, row: np.ndarray, offset: float) -> float:
        """The objective's constant for ``row . f + offset``, less the float32 network's
        rounding under ``float32: rigorous`` (``rounding``)."""
        return float(self.out_const @ row + offset) - self.rounding(row)

    def rounding(self, row: np.ndarray) -> float:
        """How far ``row . f`` of the float32 network may be below the expression's
        (``|row| . out_error``, rounded up); 0 for the exact network."""
        if self.out_error is None:
            return 0.0
        return float(np.abs(row) @ self.out_error) * float32_rounding.SAFETY

    def constraints(self) -> list[LinearConstraint]:
        """The rows as scipy constraints (the tests' independent LP reference)."""
        from scipy.optimize import LinearConstraint
        from scipy.sparse import vstack

        if not self.rows:
            return []
        matrix = vstack(self.rows).tocsr()
        return [LinearConstraint(matrix, np.concatenate(self.row_lower),
                                 np.concatenate(self.row_upper))]  # fmt: skip

    def stacked(self) -> tuple[csr_matrix | None, np.ndarray, np.ndarray]:
        """(the rows as one matrix, or None without rows; their lower and upper sides)."""
        if not self.rows:
            return None, np.zeros(0), np.zeros(0)
        from scipy.sparse import vstack

        matrix = vstack(self.rows).tocsr()
        return matrix, np.concatenate(self.row_lower), np.concatenate(self.row_upper)

    def highs_lp(self, cost: np.ndarray) -> highspy.HighsLp:
        """The model for HiGHS with objective ``cost`` (one per variable)."""
        lp = highspy.HighsLp()
        lp.num_col_ = self.n_vars
        lp.col_cost_ = np.asarray(cost, dtype=np.float64)
        lp.col_lower_, lp.col_upper_ = self.lower, self.upper
        if self.rows:
            from scipy.sparse import vstack

            matrix = vstack(self.rows).tocsr()
            inf = highspy.kHighsInf
            lp.num_row_ = matrix.shape[0]
            lp.row_lower_ = np.maximum(np.concatenate(self.row_lower), -inf)
            lp.row_upper_ = np.minimum(np.concatenate(self.row_upper), inf)
            lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
            lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = self.n_vars, matrix.shape[0]
            lp.a_matrix_.start_, lp.a_matrix_.index_ = matrix.indptr, matrix.indices
            lp.a_matrix_.value_ = matrix.data
        if self.integrality.any():
            kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
            lp.integrality_ = [kinds[int(v)] for v in self.integrality]
        return lp


def encoding_bytes(graph: BoundGraph, n_vars: int | None = None) -> int:
    """``encode``'s peak with ``n_vars`` variables: each node's expression is a dense float64
    (variables x values) matrix kept to the end, the largest copied twice while it is built.
    Without ``n_vars``, the least it can be: the inputs alone (every ReLU stable)."""
    n_vars = numel(graph.input_shape) if n_vars is None else n_vars
    sizes = [numel(op.out_shape) for op in graph.ops]
    return 8 * n_vars * (sum(sizes) + 2 * max(sizes))


def require_encoding_fits(graph: BoundGraph, kind: str, n_vars: int | None = None) -> None:
    """A ``MemoryBudgetError`` naming the estimate and the budget, before any allocation,
    where ``encode``'s dense expressions would not fit the current memory budget."""
    estimate, limit = encoding_bytes(graph, n_vars), current_budget()
    if estimate > limit:
        raise refuse(
            f"the {kind} encoding of model {graph.model!r} (one sample, "
            f"{numel(graph.input_shape)} inputs)",
            estimate,
            limit,
            "its rows are dense in the inputs, which fits networks of thousands of inputs and "
            "neurons (MNIST-sized); at this size use 'crown' or 'alpha-crown' (bounded in "
            "chunks), or 'crown-ibp' or 'ibp'",
        )


def encode(graph: BoundGraph, boxes: list[Box], relax: bool = False) -> Encoding:
    """The MILP (or LP with ``relax``) of one sample (boxes of batch size 1); refused by the
    memory budget before any allocation where it would not fit (``require_encoding_fits``)."""
    from scipy.sparse import csr_matrix

    graph.require({"input", "dense", "conv", "elementwise", "reshape", "positive-linear", "add",
                   "activation", "maxpool"}, "the complete verifier")  # fmt: skip
    if not graph.relu_only:
        raise VerificationError(
            f"the complete verifier needs a ReLU network; model {graph.model!r} has sigmoid or "
            "tanh activations (use 'alpha-crown' or 'crown', which bound them)"
        )
    rigorous = float32_rounding.active()
    if rigorous and any(op.kind == "maxpool" for op in graph.ops):
        raise VerificationError(
            f"the MILP does not encode max-pooling with float32: rigorous (model "
            f"{graph.model!r}); use engine 'bab', or float32: exact"
        )
    lo_in, hi_in = (t[0].flatten().double().numpy() for t in boxes[0])
    n_in = lo_in.size
    # count variables first: one output and one binary per unstable neuron (and max-pool vars)
    unstable, pools = {}, {}
    n_vars = n_in
    for i, op in enumerate(graph.ops):
        if op.kind == "maxpool":
            pools[i] = (plan(op, boxes[op.inputs[0]]), n_vars)
            n_vars += pools[i][0].n_vars
        if op.kind == "activation":
            lo, hi = (t[0].flatten() for t in boxes[op.inputs[0]])
            mask = ((lo < 0) & (hi > 0)).numpy()
            unstable[i] = (mask, lo.double().numpy(), hi.double().numpy(), n_vars, int(mask.sum()))
            n_vars += 2 * int(mask.sum())
    require_encoding_fits(graph, "LP" if relax else "MILP", n_vars)
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
    # float32: rigorous: per node, how far the float32 value may be from its expression
    errors = [torch.zeros(graph.input_shape, dtype=torch.float64)] if rigorous else None
    for i, op in enumerate(graph.ops[1:], start=1):
        check_time()  # a verifier's per-instance limit: a CNN's encoding takes seconds
        ins = [exprs[j] for j in op.inputs]
        if errors is not None and op.kind != "activation":
            errors.append(_f32_error(op, [errors[j] for j in op.inputs], boxes))
        if op.kind == "add":
            exprs.append((ins[0][0] + ins[1][0], ins[0][1] + ins[1][1]))
            continue
        if op.kind == "maxpool":
            pool, first = pools[i]
            flat = (ins[0][0].reshape(n_vars, -1), ins[0][1].flatten())
            (out, out_c), (y_vars, d_vars), new, new_lo, new_hi = encode_pool(pool, *flat, first)
            lower[y_vars], upper[y_vars] = pool.low, pool.top
            upper[d_vars], integrality[d_vars] = 1.0, 0 if relax else 1
            rows, row_lo, row_hi = rows + new, row_lo + new_lo, row_hi + new_hi
            exprs.append((out.reshape(n_vars, *op.out_shape), out_c.reshape(op.out_shape)))
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
        if errors is not None:  # z's float32 value within e of z: the rows hold for it
            e = errors[op.inputs[0]].flatten()
            errors.append((e * active).reshape(ins[0][1].shape))
            e = e[idx].numpy() * float32_rounding.SAFETY
        else:
            e = 0.0
        sel_a = csr_matrix((np.ones(count), (np.arange(count), a_vars)), shape=(count, n_vars))
        sel_d = csr_matrix((np.ones(count), (np.arange(count), d_vars)), shape=(count, n_vars))
        z = csr_matrix(z)
        # a - z >= c ; a - u d <= 0 ; a - z - l d <= c - l
        rows += [sel_a - z, sel_a - sel_d.multiply(hi[idx][:, None]),
                 sel_a - z - sel_d.multiply(lo[idx][:, None])]  # fmt: skip
        row_lo += [c - e, np.full(count, -np.inf), np.full(count, -np.inf)]
        row_hi += [np.full(count, np.inf), np.zeros(count), c - lo[idx] + e]
        shape = ins[0][1].shape
        exprs.append((out_matrix.reshape(n_vars, *shape), out_const.reshape(shape)))
    out_matrix, out_const = exprs[-1]
    flat_out = out_matrix.reshape(n_vars, -1).numpy()
    out_error = None if errors is None else errors[-1].flatten().numpy()
    return Encoding(n_vars, lower, upper, integrality, rows, row_lo, row_hi,
                    flat_out, out_const.flatten().numpy(), n_in, out_error)  # fmt: skip


def _f32_error(op, errors: list[torch.Tensor], boxes: list[Box]) -> torch.Tensor:
    """How far the float32 value of ``op``'s output may be from its expression: its inputs'
    distances carried through the op's absolute coefficients, plus its own rounding."""
    own = float32_rounding.error(op, [(lo[:1], hi[:1]) for lo, hi in
                                      (boxes[j] for j in op.inputs)])  # fmt: skip
    own = 0.0 if own is None else own[0]
    if op.kind == "add":
        carried = errors[0] + errors[1]
    elif op.kind in ("dense", "conv", "elementwise"):
        carried = through(op, errors[0].unsqueeze(0), constant=False)[0]
    else:  # input, reshape, positive-linear: non-negative coefficients
        carried = op.forward(errors[0].unsqueeze(0))[0]
    return (carried + own) * float32_rounding.SAFETY


# HiGHS's primal heuristics (RINS, RENS, feasibility jump, ...) spend most of the time on
# an instance that has no counterexample (sub-MIPs at the root: measured 24 of 32 s on
# vnncomp2021 mnistfc prop_5_0.03, where without them the row is proved at the 3rd node);
# counterexamples come from box-PGD and from the search itself, led by the objective.
HIGHS_OPTIONS = {
    "output_flag": False,
    "mip_heuristic_effort": 0.0,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_run_feasibility_jump": False,
    "mip_heuristic_run_root_reduced_cost": False,
}


@dataclass
class Solved:
    """One HiGHS run: a proved lower bound of the objective, the best value found (inf when
    none) and its input point (None when none)."""

    bound: float
    value: float
    point: np.ndarray | None


def new_highs() -> highspy.Highs:
    """A silent HiGHS. Its first construction in a process prints a banner on the C
    stdout, which would precede ``aisafety verify``'s answer: it goes to /dev/null."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        return highspy.Highs()
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highs = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    _BANNER_SHOWN = True
    return highs


_BANNER_SHOWN = False


def solve(
    enc: Encoding,
    cost: np.ndarray,
    constant: float,
    time_limit: float,
    cutoff: float | None = None,
    options: dict | None = None,
    stop: Callable[[], bool] | None = None,
) -> Solved:
    """min ``cost . vars + constant`` by HiGHS. With ``cutoff``, only points below it are
    looked for: the search prunes every node whose bound reaches it and stops at the first
    point under it; no point at all then proves the minimum >= ``cutoff``.

    ``time_limit`` is HiGHS's own, in wall seconds; ``stop`` (a verifier's deadline on its
    own clock, e.g. CPU seconds) is asked at HiGHS's MIP interrupt points and ends the search
    there. Either way the result is what HiGHS proved so far: its dual bound stays sound."""
    highs = new_highs()
    for key, value in {**HIGHS_OPTIONS, **(options or {})}.items():
        highs.setOptionValue(key, value)
    highs.setOptionValue("time_limit", max(float(time_limit), 0.01))
    if stop is not None:
        highs.cbMipInterrupt.subscribe(lambda event: event.interrupt() if stop() else None)
    if cutoff is not None:
        highs.setOptionValue("objective_bound", cutoff - constant)
        highs.setOptionValue("objective_target", cutoff - constant)
    highs.passModel(enc.highs_lp(cost))
    highs.run()
    status = highs.getModelStatus()
    info = highs.getInfo()
    point = None
    value = float("inf")
    if info.primal_solution_status == 2:  # a feasible point
        x = np.asarray(highs.getSolution().col_value)
        point, value = x[: enc.n_inputs], float(cost @ x + constant)
    if status == highspy.HighsModelStatus.kInfeasible:
        # nothing below the cutoff (or an empty box: the property holds vacuously)
        return Solved(float("inf") if cutoff is None else cutoff, value, point)
    if not enc.integrality.any():
        exact = status == highspy.HighsModelStatus.kOptimal
        return Solved(value if exact else float("-inf"), value, point)
    dual = float(info.mip_dual_bound)
    return Solved(dual + constant if np.isfinite(dual) else float("-inf"), value, point)


def minimise_row(
    enc: Encoding,
    row: np.ndarray,
    offset: float,
    time_limit: float,
    stop: Callable[[], bool] | None = None,
) -> tuple[float, float, np.ndarray | None]:
    """(lower bound proved, best value found, its input point or None) of ``row . f + offset``."""
    cost = enc.out_matrix @ row
    const = enc.lowest(row, offset)
    exact = {"mip_rel_gap": 0.0, "mip_abs_gap": 1e-9}
    found = solve(enc, cost, const, time_limit, options=exact, stop=stop)
    return found.bound, found.value, found.point


def decide_row(
    enc: Encoding,
    row: np.ndarray,
    offset: float,
    time_limit: float,
    stop: Callable[[], bool] | None = None,
    tolerance: float = 1e-5,
) -> tuple[float, float, np.ndarray | None]:
    """Like ``minimise_row`` but only decides the sign: looks for a point with ``row . f +
    offset <= tolerance``, led by the row itself (so HiGHS branches where the row drops).
    None proves the row > ``tolerance`` (returned as the bound; the tolerance also absorbs
    HiGHS's feasibility tolerance); the search stops at the first point found. HiGHS may
    also return a point above the cutoff with its dual bound (e.g. solved at the root): then
    min(dual bound, tolerance) is the proved bound, sound whether or not HiGHS's bound
    counts the nodes the cutoff pruned (their bounds were >= the cutoff)."""
    cost = enc.out_matrix @ row
    const = enc.lowest(row, offset)
    found = solve(enc, cost, const, time_limit, cutoff=tolerance, stop=stop)
    if found.point is None:
        return found.bound, found.value, None
    if found.value > tolerance:  # not a violation: keep what HiGHS proved
        return min(found.bound, tolerance), found.value, found.point
    return float("-inf"), found.value, found.point


def with_splits(graph: BoundGraph, boxes: list[Box], splits: dict[int, np.ndarray]) -> Encoding:
    """The MILP of one sample with branch and bound's split constraints added: for ReLU
    node ``i`` and ``splits[i][u]`` = s in {-1, 1}, the row ``s z_u >= 0`` on its input z.
    The boxes stay sound on the whole box, so the optimum is the exact minimum over the
    part of the box where the splits hold (the reference the tests check pruned domains
    against)."""
    from scipy.sparse import csr_matrix

    enc = encode(graph, boxes)
    for i, signs in splits.items():
        chosen = np.flatnonzero(signs)
        if len(chosen) == 0:
            continue
        j = graph.ops[i].inputs[0]  # z: an affine function of the variables before node i
        prefix = encode(BoundGraph(graph.ops[: j + 1], graph.model, graph.dtype), boxes[: j + 1])
        z = np.zeros((enc.n_vars, len(chosen)))
        z[: prefix.n_vars] = prefix.out_matrix[:, chosen]
        s = signs[chosen].astype(np.float64)
        enc.rows.append(csr_matrix((z * s).T))
        enc.row_lower.append(-s * prefix.out_const[chosen])
        enc.row_upper.append(np.full(len(chosen), np.inf))
    return enc
