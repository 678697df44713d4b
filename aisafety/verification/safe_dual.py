"""A proved lower bound of an LP's minimum from any row multipliers (Neumaier and Shcherbina
2004, "Safe bounds in linear and mixed-integer programming"; SCIP's safe dual bound).

An LP solver's reported optimum is not a proof: it holds within its feasibility
tolerances (HiGHS: 1e-7 per row and per reduced cost, on a scaled model) and it is computed
in rounded arithmetic. For ``min c.x`` subject to ``row_lower <= A x <= row_upper`` and
``col_lower <= x <= col_upper``, any multipliers ``y`` give ``c.x = y.(A x) + r.x`` with
``r = c - A^T y``, so for every feasible ``x``

    c.x >= sum_i min(y_i row_lower_i, y_i row_upper_i) + sum_j min(r_j col_lower_j, r_j col_upper_j)

(a side that is infinite where it is needed gives -inf). This holds for ANY ``y``: the
solver's duals only decide how tight it is, so their inaccuracy loosens the bound and
never breaks it. The bound is computed in float64 with every rounding bounded (Higham's
``gamma``, as ``float64_margin.py``): ``r`` is known within ``e_j = factor(n) (|c_j| +
(|A|^T |y|)_j)`` and the sum within ``factor(N)`` of its absolute terms. Multipliers that
would need an infinite side are set to 0 (allowed: any ``y`` is). Checked against exact
``Fraction`` optima in tests/test_safe_dual.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aisafety.verification.float64_margin import TINY, factor

if TYPE_CHECKING:
    from scipy.sparse import csr_matrix


def usable(y: np.ndarray, row_lower: np.ndarray, row_upper: np.ndarray) -> np.ndarray:
    """``y`` with every multiplier whose side is infinite (a positive one on a row with no
    lower side, a negative one with no upper side) or not finite set to 0."""
    y = np.where(np.isfinite(y), y, 0.0)
    y = np.where((y > 0) & ~np.isfinite(row_lower), 0.0, y)
    return np.where((y < 0) & ~np.isfinite(row_upper), 0.0, y)


def lower_bound(
    matrix: csr_matrix | None,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    col_lower: np.ndarray,
    col_upper: np.ndarray,
    cost: np.ndarray,
    row_dual: np.ndarray,
    cost_error: np.ndarray | float = 0.0,
) -> float:
    """A proved lower bound of ``min c.x`` over the LP (``matrix`` None: no rows) for every
    ``c`` within ``cost_error`` of ``cost``, from the multipliers ``row_dual`` (HiGHS's
    sign: ``cost - A^T y`` is the reduced cost)."""
    cost = np.asarray(cost, dtype=np.float64)
    n_rows = 0 if matrix is None else matrix.shape[0]
    y = usable(np.asarray(row_dual, dtype=np.float64), row_lower, row_upper)
    if n_rows:
        side = np.where(y > 0, row_lower, np.where(y < 0, row_upper, 0.0))
        row_terms = np.where(y != 0, y * side, 0.0)
        at, size = matrix.T @ y, abs(matrix).T @ np.abs(y)
        per_column = int(np.diff(matrix.tocsc().indptr).max(initial=0)) + 1
    else:
        row_terms = np.zeros(0)
        at, size, per_column = np.zeros_like(cost), np.zeros_like(cost), 1
    r = cost - at
    # |computed r - exact r| <= e (a dot of at most ``per_column`` products and c)
    e = factor(per_column) * (np.abs(cost) + size) + TINY * (per_column + 2) + cost_error
    columns = _column_terms(r, e, col_lower, col_upper)
    if columns is None:
        return float("-inf")
    least, spread = columns
    terms = np.concatenate([row_terms, least, -spread])
    total = float(terms.sum())
    # every product and the sum rounded: factor's headroom covers the slack's own sums
    slack = factor(len(terms)) * float(np.abs(terms).sum()) + TINY * (len(terms) + 4)
    return float(np.nextafter(total - slack, -np.inf))


def _column_terms(
    r: np.ndarray, e: np.ndarray, lower: np.ndarray, upper: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """(min of the computed ``r_j x_j`` over ``[lower_j, upper_j]``, ``e_j max |x_j|``):
    their difference is below ``r_j x_j`` for every ``r_j`` within ``e_j`` of the computed
    one (the products' rounding is the caller's); None where a column is unbounded on a
    side the exact reduced cost may point to."""
    finite_lo, finite_hi = np.isfinite(lower), np.isfinite(upper)
    # an infinite upper end needs r >= 0 for sure, an infinite lower end r <= 0
    if np.any(~finite_hi & (r - e < 0)) or np.any(~finite_lo & (r + e > 0)):
        return None
    lo = np.where(finite_lo, lower, 0.0)
    hi = np.where(finite_hi, upper, 0.0)
    at_lo = np.where(finite_lo, r * lo, np.inf)
    at_hi = np.where(finite_hi, r * hi, np.inf)
    both_inf = ~finite_lo & ~finite_hi  # a free column: r is 0 within e (checked above)
    least = np.where(both_inf, 0.0, np.minimum(at_lo, at_hi))
    return least, e * np.maximum(np.abs(lo), np.abs(hi))


def objective(
    matrix: np.ndarray, const: np.ndarray, row: np.ndarray, offset: float
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(``matrix @ row``, a bound on its rounding per entry, ``const . row + offset``, a
    bound on its rounding): an objective composed in float64 from an encoding's output
    expressions, rounded like any other sum (``lower_bound`` takes the first error, the
    caller subtracts the second)."""
    n = int(np.count_nonzero(row)) + 1
    cost = matrix @ row
    cost_error = factor(n) * (np.abs(matrix) @ np.abs(row)) + TINY * (n + 2)
    constant = float(const @ row + offset)
    size = float(np.abs(const) @ np.abs(row)) + abs(offset)
    return cost, cost_error, constant, factor(n) * size + TINY * (n + 2)
