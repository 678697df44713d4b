"""The exact minimum of a conjunction's largest row, the reference of the conjunction tests.

A disjunct of K atoms holds where every row_k = spec_k . f(x) + offset_k is <= 0, so its
margin is min_x max_k row_k. On a ReLU network's MILP (``milp.encode``/``with_splits``)
one more variable t with a row t - row_k >= 0 per atom makes min t that minimum, which
HiGHS decides exactly. The fuzz of the VNN-COMP route (vnncomp_fuzz.py) and the joint
search's tests (tests/test_conjunction_search.py) both check against it.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix, hstack

from aisafety.verification.milp import Encoding


def with_max_row(
    enc: Encoding, spec: np.ndarray, offset: np.ndarray, t_lower: float, t_upper: float
) -> tuple[Encoding, np.ndarray]:
    """``enc`` with t in [``t_lower``, ``t_upper``] and t >= row_k for each of the K rows
    (``spec`` (K, outputs), ``offset`` (K,)), and the cost vector of min t."""
    k = len(offset)
    coeff = enc.out_matrix @ spec.T  # (variables, K): row_k = vars . coeff_k + const_k
    const = enc.out_const @ spec.T + offset
    rows = [hstack([r, csr_matrix((r.shape[0], 1))]).tocsr() for r in enc.rows]
    rows.append(csr_matrix(np.hstack([-coeff.T, np.ones((k, 1))])))
    out = np.vstack([enc.out_matrix, np.zeros((1, enc.out_matrix.shape[1]))])
    with_t = Encoding(enc.n_vars + 1, np.append(enc.lower, t_lower), np.append(enc.upper, t_upper),
                      np.append(enc.integrality, 0), rows, [*enc.row_lower, const],
                      [*enc.row_upper, np.full(k, np.inf)], out, enc.out_const,
                      enc.n_inputs)  # fmt: skip
    cost = np.zeros(enc.n_vars + 1)
    cost[-1] = 1.0
    return with_t, cost
