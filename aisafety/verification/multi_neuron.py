"""The convex hull of k ReLUs at once (Singh et al. 2019, "Beyond the single neuron convex
barrier"), as rows added to an LP ``Encoding``.

A group's inputs z (k unstable neurons of one layer) lie in the octahedral polytope
P = {l <= z <= u, s . z <= delta_s for every s in {-1, 0, 1}^k with two or more non-zeros},
each delta_s an LP upper bound over the network before the layer. The group's outputs
a = relu(z) then lie in the convex hull of the 2^k pieces {(z, D_sigma z) : z in P, z in
orthant sigma}. ERAN's K-ReLU computes that hull's facets with cdd; we write the same set
as Balas's extended formulation (one scaled copy of P per piece: x_sigma in t_sigma P,
x_sigma in its orthant, sum t_sigma = 1, z = sum x_sigma, a = sum_{sigma_i = 1} x_sigma,i),
whose projection on (z, a) is that hull exactly, so no facet enumeration is needed: 2^k
(k + 1) variables and ~2^k 3^k rows per group.

Projected on one neuron, the hull lies in that neuron's triangle (every piece does), so an
LP with the triangles and these rows is never looser than the triangle LP alone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from aisafety.verification.milp import Encoding


def directions(k: int) -> np.ndarray:
    """The octahedral directions s in {-1, 0, 1}^k with at least two non-zeros, (m, k)."""
    every = np.array(list(itertools.product((-1.0, 0.0, 1.0), repeat=k)))
    return every[(every != 0).sum(1) >= 2]


@dataclass
class Group:
    """k unstable neurons of one layer: their inputs as expressions of the base LP's
    variables (z = vars @ z_matrix + z_const), their output variables, and P."""

    z_matrix: np.ndarray  # (n_vars_then, k)
    z_const: np.ndarray  # (k,)
    a_vars: np.ndarray  # (k,) column indices of the relu outputs
    lower: np.ndarray  # (k,)
    upper: np.ndarray  # (k,)
    delta: np.ndarray  # (m,) upper bounds of directions(k) . z (inf: none proved)

    def add_to(self, enc: Encoding) -> Encoding:
        """``enc`` with this group's hull rows and its 2^k (k + 1) variables appended."""
        from scipy.sparse import csr_matrix

        k, start = len(self.a_vars), enc.n_vars
        patterns = np.array(list(itertools.product((0.0, 1.0), repeat=k)))  # (2^k, k)
        n = start + len(patterns) * (k + 1)
        x_col = start + np.arange(len(patterns))[:, None] * (k + 1) + np.arange(k)  # (2^k, k)
        t_col = start + np.arange(len(patterns)) * (k + 1) + k
        dense, lo, hi = [], [], []

        def row(cols, values, low, high):
            line = np.zeros(n)
            np.add.at(line, np.asarray(cols), np.asarray(values, dtype=np.float64))
            dense.append(line)
            lo.append(low)
            hi.append(high)

        s, delta = directions(k), self.delta
        for p in range(len(patterns)):
            for i in range(k):  # l t <= x <= u t
                row([x_col[p, i], t_col[p]], [1.0, -self.lower[i]], 0.0, np.inf)
                row([x_col[p, i], t_col[p]], [1.0, -self.upper[i]], -np.inf, 0.0)
            for d in np.flatnonzero(np.isfinite(delta)):  # s . x <= delta_s t
                row([*x_col[p], t_col[p]], [*s[d], -delta[d]], -np.inf, 0.0)
        row(t_col, np.ones(len(t_col)), 1.0, 1.0)
        base = len(self.z_matrix)
        for i in range(k):  # sum_p x_p,i - z_i = c_i ; a_i - sum_{sigma_i = 1} x_p,i = 0
            line = np.zeros(n)
            line[x_col[:, i]] = 1.0
            line[:base] -= self.z_matrix[:, i]
            dense.append(line)
            lo.append(self.z_const[i])
            hi.append(self.z_const[i])
            on = x_col[patterns[:, i] == 1, i]
            row([self.a_vars[i], *on], [1.0, *(-np.ones(len(on)))], 0.0, 0.0)
        lower = np.concatenate([enc.lower, np.zeros(n - start)])
        upper = np.concatenate([enc.upper, np.zeros(n - start)])
        # each copy in its orthant, within [l, u]: implied by l t <= x <= u t, 0 <= t <= 1
        # (the LP is the same), and finite as the safe dual bound needs (``safe_dual.py``)
        lower[x_col] = np.where(patterns == 1, 0.0, np.minimum(self.lower, 0.0))
        upper[x_col] = np.where(patterns == 1, np.maximum(self.upper, 0.0), 0.0)
        upper[t_col] = 1.0
        rows = [csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], n)) for m in enc.rows]
        out = np.vstack([enc.out_matrix, np.zeros((n - start, enc.out_matrix.shape[1]))])
        integrality = np.concatenate([enc.integrality, np.zeros(n - start)])
        return Encoding(n, lower, upper, integrality, [*rows, csr_matrix(np.array(dense))],
                        [*enc.row_lower, np.array(lo)], [*enc.row_upper, np.array(hi)], out,
                        enc.out_const, enc.n_inputs)  # fmt: skip
