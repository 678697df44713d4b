"""A ReLU network on a box as quadratic constraints on v = [1, x, a_1, ..., a_(L-1)]
(the input and every hidden activation), for the SDP verifiers (``sdp.py``, ``lmi.py``).

Each constraint is a product of two affine forms of v, g(v) = (alpha . v)(beta . v),
i.e. v^T sym(alpha beta^T) v, kept as the flattened symmetric matrix:

* input box: (x_i - l_i)(u_i - x_i) >= 0;
* per unstable hidden neuron, z = M a_prev + c with bounds l < 0 < u (CROWN's): a >= 0,
  a - z >= 0, a (a - z) = 0 (Raghunathan et al. 2018's ReLU), and a (u - a) >= 0;
* with ``pairs``, per two unstable neurons i, j of a layer, the slope restriction of the
  repeated ReLU (Fazlyab et al. 2020): (a_i - a_j)((z_i - z_j) - (a_i - a_j)) >= 0.

Every point of the network on the box satisfies all of them, so a bound over any set they
describe is sound. ``radius2`` bounds ||v||^2 on that set (1 + the largest squares of the
boxes), which turns a slightly infeasible dual certificate into a sound one (``lmi.py``).

The matrices are computed in float64, so they are within a bound of the exact ones (the
network's affine maps composed exactly, ``sdp_rounding.py``): ``build`` carries an
entrywise bound of every form's error and keeps, per constraint, a bound of the spectral
norm of its matrix's error; ``certified_bound`` charges them with its own rounding.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from aisafety.verification.dense import affine_segments
from aisafety.verification.float64_margin import TINY, factor
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.ops import Box
from aisafety.verification.psd_bound import smallest_eigenvalue_below
from aisafety.verification.sdp_rounding import affine_error, constraint_error, segment_errors


def require_cvxpy(verifier: str):
    """cvxpy, or an error naming the extra that installs it."""
    try:
        import clarabel  # noqa: F401
        import cvxpy
    except ImportError as exc:
        raise VerificationError(
            f"verifier {verifier!r} needs cvxpy and Clarabel ({exc}); install them with "
            "pip install 'aisafety[sdp]'"
        ) from None
    return cvxpy


def solved(problem, cp) -> bool:
    """Clarabel on ``problem``: whether it reached an (inaccurate) optimum. A solver failure
    (``SolverError``, e.g. on weights of order 1e3) is no answer rather than an error that
    ends the whole call: the caller keeps CROWN's bound. Clarabel's "may be inaccurate"
    warning is dropped: every solution is re-certified (``certified_bound``), so its
    accuracy costs tightness only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        try:
            problem.solve(solver=cp.CLARABEL)
        except cp.error.SolverError:
            return False
    return problem.status in ("optimal", "optimal_inaccurate")


@dataclass
class Qcqp:
    """min q . v subject to v^T G_k v >= 0 (``ineq`` rows) and v^T H v = 0 (``eq``), v_0 = 1.

    ``ineq_error``/``eq_error``: per constraint, a bound of ``||stored - exact||_2``;
    ``objective_error``: entrywise, of ``|stored objective_map - exact|`` (zeros: exact)."""

    size: int
    ineq: Any  # sparse (m, size * size)
    eq: Any  # sparse (p, size * size)
    objective_map: np.ndarray  # (outputs, size): output = objective_map @ v
    radius2: float
    ineq_error: np.ndarray | None = None
    eq_error: np.ndarray | None = None
    objective_error: np.ndarray | None = field(default=None, repr=False)

    def objective(self, row: np.ndarray) -> np.ndarray:
        """The spec row's value as v^T Q v with v_0 = 1, Q flattened (size * size,)."""
        q = row @ self.objective_map
        return _sym(q, _unit(0, self.size)).ravel()

    def objective_norm_error(self, row: np.ndarray) -> float:
        """A bound of ``||Q - exact Q||_2`` for the spec row: Q = sym(q, e0) is exact in q
        (its entries are q_j and q_j / 2), so ``||e_q||`` bounds it, e_q the error of q."""
        row = np.abs(np.asarray(row, dtype=np.float64))
        terms = len(row) + 1
        e_q = factor(terms) * (row @ np.abs(self.objective_map))
        if self.objective_error is not None:
            e_q = e_q + row @ self.objective_error
        return float(np.linalg.norm(e_q)) * (1 + factor(self.size)) + TINY * terms

    @cached_property
    def _absolute(self) -> tuple[Any, Any, int]:
        """|ineq|, |eq| and the most nonzeros of one column of the constraint matrices."""
        from scipy.sparse import vstack

        both = vstack([self.ineq, self.eq]).tocsc()
        most = int(np.diff(both.indptr).max(initial=0))
        return abs(self.ineq), abs(self.eq), most


def size_of(graph: BoundGraph, boxes: list[Box] | None = None) -> int:
    """N = 1 + inputs + unstable hidden neurons (every hidden neuron without ``boxes``):
    the side of the SDP's matrix."""
    maps, cuts = affine_segments(graph)
    if boxes is None:
        return 1 + maps[0][0].shape[1] + sum(m.shape[0] for m, _ in maps[:-1])
    unstable = 0
    for cut in cuts:
        lo, hi = (t[0].flatten() for t in boxes[graph.ops[cut].inputs[0]])
        unstable += int(((lo < 0) & (hi > 0)).sum())
    return 1 + maps[0][0].shape[1] + unstable


def build(graph: BoundGraph, boxes: list[Box], pairs: bool) -> Qcqp:
    """The constraints of one sample (``boxes`` of batch one: the input's and every
    activation input's bounds). Only unstable ReLUs get a variable; a stable one is its
    input (active) or 0 (dead), so the lifted set keeps an interior. Each form (a row over
    v) carries ``slack``, an entrywise bound of its float64 error."""
    maps, cuts = affine_segments(graph)
    errors = segment_errors(graph)
    lower, upper = (t[0].flatten().double().numpy() for t in boxes[0])
    n = size_of(graph, boxes)
    ineq, eq, ineq_error, eq_error = [], [], [], []
    one, exact = _unit(0, n), np.zeros(n)

    def add(into: list, norms: list, alpha, beta, e_alpha=exact, e_beta=exact) -> None:
        into.append(_sym(alpha, beta))
        norms.append(constraint_error(alpha, beta, e_alpha, e_beta))

    for i in range(len(lower)):  # (x_i - l_i)(u_i - x_i) >= 0
        add(ineq, ineq_error, _affine(n, 1 + i, -lower[i]), _affine(n, 1 + i, -upper[i], -1))
    radius2 = 1.0 + float(np.maximum(lower**2, upper**2).sum())
    forms = np.eye(n)[1 : 1 + len(lower)]  # the previous layer's values as forms of v
    slack = np.zeros_like(forms)
    first = 1 + len(lower)
    for (matrix, const), (e_matrix, e_const), cut in zip(maps[:-1], errors[:-1], cuts, strict=True):
        m, c = matrix.double().numpy(), const.double().numpy()
        z, e_z = affine_error(m, c, forms, slack, e_matrix, e_const)
        lo, hi = (t[0].flatten().double().numpy() for t in boxes[graph.ops[cut].inputs[0]])
        unstable = np.flatnonzero((lo < 0) & (hi > 0))
        active = (lo >= 0)[:, None]
        forms, slack = np.where(active, z, 0.0), np.where(active, e_z, 0.0)
        forms[unstable] = np.eye(n)[first : first + len(unstable)]
        slack[unstable] = 0.0
        first += len(unstable)
        for r, j in enumerate(unstable):  # a's index is new: a - z and hi - a are exact
            a = forms[j]
            add(ineq, ineq_error, a, one)
            add(ineq, ineq_error, a - z[j], one, e_z[j])
            add(ineq, ineq_error, a, hi[j] * one - a)
            add(eq, eq_error, a, a - z[j], exact, e_z[j])
            if pairs:
                for k in unstable[:r]:
                    da, dz = a - forms[k], z[j] - z[k]
                    e_dz = e_z[j] + e_z[k] + factor(1) * np.abs(dz)  # z_j - z_k rounds
                    add(ineq, ineq_error, da, dz - da, exact, e_dz)
        radius2 += float((hi[unstable] ** 2).sum())
    (last, const), (e_last, e_const) = maps[-1], errors[-1]
    out, e_out = affine_error(last.double().numpy(), const.double().numpy(), forms, slack,
                              e_last, e_const)  # fmt: skip
    radius2 = radius2 * (1 + factor(n + 2))  # its sums rounded up
    return Qcqp(n, _rows(ineq, n), _rows(eq, n), out, radius2, np.array(ineq_error),
                np.array(eq_error), e_out)  # fmt: skip


def _rows(matrices: list[np.ndarray], n: int):
    """The flattened matrices as the rows of a sparse (len, n * n) matrix."""
    from scipy.sparse import csr_matrix, vstack

    if not matrices:
        return csr_matrix((0, n * n))
    return vstack([csr_matrix(m.reshape(1, -1)) for m in matrices]).tocsr()


def certified_bound(qcqp: Qcqp, row: np.ndarray, gamma: float, mu, lam) -> float:
    """A proved lower bound of the spec ``row`` on the network from any multipliers: with
    mu >= 0 and F = Q - gamma e0 e0^T - sum mu G - sum lam H (exact matrices),
    row . f - gamma >= v^T F v >= min(lambda_min(F), 0) ||v||^2 on every point of the
    network, ||v||^2 <= ``radius2``. lambda_min(F) is bounded below by the computed F's
    proved bound (``psd_bound.py``) minus the computed F's rounding and the matrices'
    errors (``Qcqp``); non-finite multipliers count as 0 (any multipliers are allowed)."""
    if not np.isfinite(gamma):
        return float("-inf")
    q = qcqp.objective(row)
    mu = np.asarray(mu, dtype=np.float64).ravel()
    mu = np.where(np.isfinite(mu), np.maximum(mu, 0.0), 0.0)
    lam = np.asarray(lam, dtype=np.float64).ravel()
    lam = np.where(np.isfinite(lam), lam, 0.0)
    f = q - qcqp.ineq.T @ mu - (qcqp.eq.T @ lam if len(lam) else 0.0)
    abs_ineq, abs_eq, most = qcqp._absolute
    size = np.abs(q) + abs_ineq.T @ mu + (abs_eq.T @ np.abs(lam) if len(lam) else 0.0)
    n = qcqp.size
    f, size = f.reshape(n, n), size.reshape(n, n)
    f = (f + f.T) / 2
    f[0, 0] -= gamma
    # |computed f - exact f|: each entry a sum of ``most`` + 1 products, then the
    # symmetrisation and gamma's subtraction (factor covers both further roundings)
    e_f = factor(most + 3) * ((size + size.T) / 2 + np.abs(f)) + TINY * (most + 3)
    e_f[0, 0] += factor(1) * abs(gamma)
    charge = float(np.linalg.norm(e_f)) + qcqp.objective_norm_error(row)  # ||.||_2 <= ||.||_F
    if qcqp.ineq_error is not None:
        charge += float(mu @ qcqp.ineq_error)
    if qcqp.eq_error is not None and len(lam):
        charge += float(np.abs(lam) @ qcqp.eq_error)
    charge *= 1 + factor(len(mu) + len(lam) + n * n)  # the norms' and dots' own rounding
    smallest = smallest_eigenvalue_below(f) - charge
    if not np.isfinite(smallest):
        return float("-inf")
    drop = min(smallest, 0.0) * qcqp.radius2
    bound = gamma + drop - factor(2) * (abs(gamma) + abs(drop)) - TINY
    return float(np.nextafter(bound, -np.inf))


def _unit(i: int, n: int) -> np.ndarray:
    e = np.zeros(n)
    e[i] = 1.0
    return e


def _affine(n: int, i: int, offset: float, sign: float = 1.0) -> np.ndarray:
    """The form sign * (v_i + offset) (v_0 = 1)."""
    form = np.zeros(n)
    form[i], form[0] = sign, sign * offset
    return form


def _sym(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """The symmetric matrix of (alpha . v)(beta . v)."""
    outer = np.outer(alpha, beta)
    return (outer + outer.T) / 2


def boxes_of(graph: BoundGraph, lower: torch.Tensor, upper: torch.Tensor) -> list[Box]:
    """CROWN's boxes of one sample, the hidden bounds the constraints use."""
    from aisafety.verification.bounds import linear_boxes

    return linear_boxes(graph, lower, upper)
