"""LMIVerify (Fazlyab, Morari & Pappas 2020, "DeepSDP"): a certificate that the spec row
is >= gamma, as a linear matrix inequality in the multipliers of the network's quadratic
constraints, solved by Clarabel through cvxpy.

With v = [1, x, a_1, ...] and the constraints of ``quadratic.py`` including the repeated
ReLU's slope restrictions between every two unstable neurons of a layer (``pairs``), the
S-procedure asks for mu >= 0 and free lambda with

    Q - gamma e0 e0^T - sum_k mu_k G_k - sum_m lambda_m H_m  PSD,

which makes q . v - gamma >= sum mu g + sum lambda h >= 0 on every point of the network;
gamma is maximised. This is the dual of SDPVerify's relaxation with more constraints, so
its bound is at least SDPVerify's up to the solvers' tolerance (declared). The returned
multipliers are re-checked (``quadratic.certified_bound``: mu clipped, a proved lower
bound of the smallest eigenvalue, every float64 rounding charged, its shortfall charged on
||v||^2), so the bound is sound whatever the solver's accuracy. Cost: one multiplier per
pair of unstable neurons of a layer.
"""

from __future__ import annotations

import numpy as np

from aisafety.verification.quadratic import Qcqp, certified_bound, require_cvxpy, solved
from aisafety.verification.sdp import SdpVerifier


class LmiVerifier(SdpVerifier):
    name = "lmiverify"
    description = (
        "LMIVerify (Fazlyab et al. 2020): the quadratic-constraint LMI certificate (S-procedure "
        "over the ReLU and repeated-ReLU constraints; Clarabel through cvxpy); small ReLU networks"
    )
    pairs = True
    tighter_than = ("sdpverify",)

    def solve(self, qcqp: Qcqp, row: np.ndarray) -> float:
        """The LMI's largest gamma, re-certified (-inf if the solver fails)."""
        cp = require_cvxpy(self.name)
        n, q = qcqp.size, qcqp.objective(row)
        gamma = cp.Variable()
        mu = cp.Variable(qcqp.ineq.shape[0], nonneg=True)
        lam = cp.Variable(qcqp.eq.shape[0])
        slack = cp.Variable((n, n), PSD=True)
        corner = np.zeros(n * n)
        corner[0] = 1.0
        combined = qcqp.ineq.T @ mu + (qcqp.eq.T @ lam if qcqp.eq.shape[0] else 0)
        lmi = cp.vec(slack, order="C") == q - gamma * corner - combined
        problem = cp.Problem(cp.Maximize(gamma), [lmi])
        if not solved(problem, cp):
            return float("-inf")
        found = lam.value if qcqp.eq.shape[0] else np.zeros(0)
        return certified_bound(qcqp, row, float(gamma.value), mu.value, found)
