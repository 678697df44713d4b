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


class SafeLP:
    """One LP's rows and columns, with what every ``bound`` reuses (the transposed matrix,
    its absolute values, the most nonzeros of a column, which sides are finite) computed
    once: an LP solved for many objectives (``lp_full.LinearPrograms``) pays it once."""

    def __init__(
        self,
        matrix: csr_matrix | None,
        row_lower: np.ndarray,
        row_upper: np.ndarray,
        col_lower: np.ndarray,
        col_upper: np.ndarray,
    ):
        self.empty = matrix is None or matrix.shape[0] == 0
        if not self.empty:
            self.at = matrix.T.tocsr()
            self.abs_at = abs(self.at)
            self.per_column = int(np.diff(self.at.indptr).max(initial=0)) + 1
            self.lower_ok, self.upper_ok = np.isfinite(row_lower), np.isfinite(row_upper)
            self.row_lower = np.where(self.lower_ok, row_lower, 0.0)
            self.row_upper = np.where(self.upper_ok, row_upper, 0.0)
        self.col_lower, self.col_upper = np.asarray(col_lower), np.asarray(col_upper)
        self.boxed = bool(np.isfinite(self.col_lower).all() and np.isfinite(self.col_upper).all())
        self.col_size = np.maximum(np.abs(self.col_lower), np.abs(self.col_upper))

    def bound(
        self, cost: np.ndarray, row_dual: np.ndarray, cost_error: np.ndarray | float = 0.0
    ) -> float:
        """A proved lower bound of ``min c.x`` over the LP for every ``c`` within
        ``cost_error`` of ``cost``, from the multipliers ``row_dual`` (HiGHS's sign: ``cost
        - A^T y`` is the reduced cost). A multiplier whose side is infinite, or that is not
        finite, counts as 0 (allowed: any ``y`` is)."""
        cost = np.asarray(cost, dtype=np.float64)
        if self.empty:
            row_terms, at, size, per_column = np.zeros(0), 0.0, 0.0, 1
        else:
            y = np.asarray(row_dual, dtype=np.float64)
            y = np.where(((y > 0) & self.lower_ok) | ((y < 0) & self.upper_ok), y, 0.0)
            row_terms = y * np.where(y > 0, self.row_lower, self.row_upper)
            at, size, per_column = self.at @ y, self.abs_at @ np.abs(y), self.per_column
        r = cost - at
        # |computed r - exact r| <= e (a dot of at most ``per_column`` products and c)
        e = factor(per_column) * (np.abs(cost) + size) + TINY * (per_column + 2) + cost_error
        if self.boxed:
            least, spread = np.minimum(r * self.col_lower, r * self.col_upper), e * self.col_size
        else:
            columns = _column_terms(r, e, self.col_lower, self.col_upper)
            if columns is None:
                return float("-inf")
            least, spread = columns
        total = float(row_terms.sum()) + float(least.sum()) - float(spread.sum())
        size = float(np.abs(row_terms).sum()) + float(np.abs(least).sum()) + float(spread.sum())
        n = len(row_terms) + 2 * len(least)
        # every product and the sums rounded: factor's headroom covers the slack's own sums
        slack = factor(n + 3) * size + TINY * (n + 4)
        return float(np.nextafter(total - slack, -np.inf))


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
    """``SafeLP.bound`` of one LP (``matrix`` None: no rows)."""
    lp = SafeLP(matrix, row_lower, row_upper, col_lower, col_upper)
    return lp.bound(cost, row_dual, cost_error)


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
    matrix: np.ndarray,
    const: np.ndarray,
    row: np.ndarray,
    offset: float,
    abs_matrix: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(``matrix @ row``, a bound on its rounding per entry, ``const . row + offset``, a
    bound on its rounding): an objective composed in float64 from an encoding's output
    expressions, rounded like any other sum (``lower_bound`` takes the first error, the
    caller subtracts the second). ``abs_matrix``: ``|matrix|``, where a caller keeps it."""
    n = int(np.count_nonzero(row)) + 1
    cost = matrix @ row
    abs_matrix = np.abs(matrix) if abs_matrix is None else abs_matrix
    cost_error = factor(n) * (abs_matrix @ np.abs(row)) + TINY * (n + 2)
    constant = float(const @ row + offset)
    size = float(np.abs(const) @ np.abs(row)) + abs(offset)
    return cost, cost_error, constant, factor(n) * size + TINY * (n + 2)
