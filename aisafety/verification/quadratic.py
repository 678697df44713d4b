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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aisafety.verification.dense import affine_segments
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.ops import Box


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


@dataclass
class Qcqp:
    """min q . v subject to v^T G_k v >= 0 (``ineq`` rows) and v^T H v = 0 (``eq``), v_0 = 1."""

    size: int
    ineq: Any  # sparse (m, size * size)
    eq: Any  # sparse (p, size * size)
    objective_map: np.ndarray  # (outputs, size): output = objective_map @ v
    radius2: float

    def objective(self, row: np.ndarray) -> np.ndarray:
        """The spec row's value as v^T Q v with v_0 = 1, Q flattened (size * size,)."""
        q = row @ self.objective_map
        return _sym(q, _unit(0, self.size)).ravel()


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
    input (active) or 0 (dead), so the lifted set keeps an interior."""
    maps, cuts = affine_segments(graph)
    lower, upper = (t[0].flatten().double().numpy() for t in boxes[0])
    n = size_of(graph, boxes)
    ineq, eq = [], []
    one = _unit(0, n)
    for i in range(len(lower)):  # (x_i - l_i)(u_i - x_i) >= 0
        ineq.append(_sym(_affine(n, 1 + i, -lower[i]), _affine(n, 1 + i, -upper[i], -1)))
    radius2 = 1.0 + float(np.maximum(lower**2, upper**2).sum())
    forms = np.eye(n)[1 : 1 + len(lower)]  # the previous layer's values as forms of v
    first = 1 + len(lower)
    for (matrix, const), cut in zip(maps[:-1], cuts, strict=True):
        z = matrix.double().numpy() @ forms
        z[:, 0] += const.double().numpy()
        lo, hi = (t[0].flatten().double().numpy() for t in boxes[graph.ops[cut].inputs[0]])
        unstable = np.flatnonzero((lo < 0) & (hi > 0))
        forms = np.where((lo >= 0)[:, None], z, 0.0)
        forms[unstable] = np.eye(n)[first : first + len(unstable)]
        first += len(unstable)
        for r, j in enumerate(unstable):
            a = forms[j]
            ineq += [_sym(a, one), _sym(a - z[j], one), _sym(a, hi[j] * one - a)]
            eq.append(_sym(a, a - z[j]))
            if pairs:
                for k in unstable[:r]:
                    da, dz = a - forms[k], z[j] - z[k]
                    ineq.append(_sym(da, dz - da))
        radius2 += float((hi[unstable] ** 2).sum())
    last, const = (t.double().numpy() for t in maps[-1])
    out = last @ forms
    out[:, 0] += const
    return Qcqp(n, _rows(ineq, n), _rows(eq, n), out, radius2)


def _rows(matrices: list[np.ndarray], n: int):
    """The flattened matrices as the rows of a sparse (len, n * n) matrix."""
    from scipy.sparse import csr_matrix, vstack

    if not matrices:
        return csr_matrix((0, n * n))
    return vstack([csr_matrix(m.reshape(1, -1)) for m in matrices]).tocsr()


def certified_bound(qcqp: Qcqp, q: np.ndarray, gamma: float, mu, lam) -> float:
    """A sound lower bound of q . v on the network from any multipliers: with mu clipped
    to >= 0 and F = Q - gamma e0 e0^T - sum mu G - sum lam H, q . v - gamma >= v^T F v
    >= min(eig(F), 0) ||v||^2 on every point of the network, ||v||^2 <= ``radius2``."""
    mu = np.maximum(np.asarray(mu, dtype=np.float64).ravel(), 0.0)
    lam = np.asarray(lam, dtype=np.float64).ravel()
    f = q - qcqp.ineq.T @ mu - (qcqp.eq.T @ lam if len(lam) else 0.0)
    f = f.reshape(qcqp.size, qcqp.size)
    f = (f + f.T) / 2
    f[0, 0] -= gamma
    smallest = float(np.linalg.eigvalsh(f)[0])
    return gamma + min(smallest, 0.0) * qcqp.radius2 * (1 + 1e-9) - 1e-12 * (1 + abs(gamma))


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
