"""A proved lower bound of a symmetric float64 matrix's smallest eigenvalue.

``numpy.linalg.eigvalsh`` is backward stable, not verified: its smallest eigenvalue can be
above the exact one by about ``n u ||A||``. The bound here is a shifted Cholesky test
(Rump 2006, "Verification of positive definiteness", BIT 46): if the floating-point
Cholesky factorisation of ``M = A - c I`` (diagonal rounded down, so ``A - c I - M`` is a
non-negative diagonal) runs to completion, then ``R^T R = M + dM`` with
``|dM| <= gamma_(n+1) |R^T| |R|`` (Demmel 1989; Higham, Accuracy and Stability, Thm 10.3,
for any order of the inner products, so LAPACK's blocked ``potrf`` too), hence
``||dM||_2 <= gamma_(n+1) sum_j ||r_j||^2 <= gamma_(n+1) / (1 - gamma_(n+1)) tr(M)`` and

    lambda_min(A) >= c - gamma_(n+1) / (1 - gamma_(n+1)) tr(M) - underflow,

the underflow term being Rump's ``n (2 (n + 2) + max a_ii) eta``, doubled. The shift
starts just below eigvalsh's estimate and moves down until the factorisation succeeds;
if it never does, Gershgorin's bound (every rounding bounded) is returned.
"""

from __future__ import annotations

import numpy as np

from aisafety.verification.float64_margin import TINY, factor

ETA = 2.0**-1074  # the smallest positive subnormal float64
TRIES = 6  # shifts tried below the estimate, each 16 times further down


def smallest_eigenvalue_below(a: np.ndarray) -> float:
    """A number <= the exact smallest eigenvalue of the symmetric matrix ``a`` (-inf if
    ``a`` is not finite)."""
    a = np.asarray(a, dtype=np.float64)
    if not np.isfinite(a).all():
        return float("-inf")
    n = a.shape[0]
    if n == 0:
        return float("inf")
    estimate = float(np.linalg.eigvalsh(a)[0])
    step = factor(n + 1) * (float(np.abs(a).sum()) + abs(estimate) * n) + n * TINY
    for t in range(TRIES):
        proved = _shifted_cholesky(a, estimate - step * 16.0**t)
        if proved is not None:
            return proved
    return gershgorin_below(a)


def _shifted_cholesky(a: np.ndarray, shift: float) -> float | None:
    """The bound above for the shift ``c``, or None if the factorisation of ``A - c I``
    does not complete."""
    n = a.shape[0]
    m = a.copy()
    diagonal = np.diagonal(a) - shift
    m[np.diag_indices(n)] = np.nextafter(diagonal, -np.inf)  # <= the exact a_ii - c
    if not np.isfinite(m).all():
        return None
    try:
        np.linalg.cholesky(m)
    except np.linalg.LinAlgError:
        return None
    d = np.diagonal(m)
    trace = float(d.sum()) + factor(n) * float(np.abs(d).sum())  # >= the exact trace
    g = factor(n + 1)  # >= gamma_(n+1)
    largest = float(np.abs(np.diagonal(a)).max())
    underflow = 2 * n * ((2 * (n + 2) + 1) * ETA + largest * ETA)
    charge = g / (1 - g) * max(trace, 0.0) + underflow
    # c - charge, every rounding down: the charge rounded up by factor(4), then nextafter
    return float(np.nextafter(shift - charge * (1 + factor(4)), -np.inf))


def gershgorin_below(a: np.ndarray) -> float:
    """``min_i (a_ii - sum_(j != i) |a_ij|)``, the sums rounded up (every eigenvalue of a
    symmetric matrix is in one of its Gershgorin discs)."""
    n = a.shape[0]
    off = np.abs(a).sum(1) - np.abs(np.diagonal(a))
    off = off + factor(n + 1) * np.abs(a).sum(1) + TINY * n  # the sums' rounding, up
    low = np.diagonal(a) - off
    low = low - factor(1) * np.abs(low)
    return float(np.nextafter(low.min(), -np.inf))
