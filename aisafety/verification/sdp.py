"""SDPVerify (Raghunathan, Steinhardt & Liang 2018): the semidefinite relaxation of a ReLU
network, solved by Clarabel through cvxpy.

v = [1, x, a_1, ...] is lifted to P ~ v v^T, relaxed to P PSD with P_00 = 1, and every
quadratic constraint of ``quadratic.py`` (without the pairs) becomes linear in P; each spec
row is minimised over that set. The reported bound is not the solver's objective but the
certificate its dual variables give (``quadratic.certified_bound``): sound for any
multipliers, so the solver's tolerance cannot make it too high.

Clarabel (an interior-point conic solver, Apache-2.0, cvxpy's default for SDPs) rather
than SCS: it solves these small SDPs to 1e-8, where SCS's first-order method stops near
1e-4, which the certificate would then pay for in looseness. The matrix is N x N with
N = 1 + inputs + unstable hidden neurons (stable ones are affine); where 1 + inputs +
every hidden neuron exceeds ``max_size`` the verifier refuses before any work (an
interior-point method keeps a dense (N^2 / 2)^2 scaling block for the PSD cone).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from aisafety.verification import bounds as b
from aisafety.verification.base import Verifier, VerifierConfig
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.property import Property
from aisafety.verification.quadratic import (
    Qcqp,
    build,
    certified_bound,
    require_cvxpy,
    size_of,
    solved,
)


class SdpConfig(VerifierConfig):
    max_size: int = Field(
        default=120, gt=1, description="largest N = 1 + inputs + hidden neurons accepted"
    )


class SdpVerifier(Verifier):
    name = "sdpverify"
    description = (
        "SDPVerify (Raghunathan et al. 2018): the SDP relaxation of the ReLU network "
        "(Clarabel through cvxpy, bound from the dual certificate); small ReLU networks"
    )
    Config = SdpConfig
    pairs = False  # the repeated-ReLU constraints (LMIVerify adds them)

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        graph.require_sequential(self.name, use="'lp-full' or 'crown'")
        require_cvxpy(self.name)
        n = size_of(graph)
        if n > self.config.max_size:
            raise VerificationError(
                f"verifier {self.name!r}: model {graph.model!r} gives an SDP matrix of side "
                f"{n} (1 + inputs + hidden neurons), above max_size {self.config.max_size} "
                f"(memory grows as N^4: ~{2 * n**4 / 2**30:.1f} GiB here); use 'lp-full' or "
                "'crown', or raise max_size if the machine has the memory"
            )

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        return 2 * size_of(graph) ** 4  # the PSD cone's dense scaling block, (N^2 / 2)^2

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        """Each row's better sound bound: the SDP's certificate or CROWN's (CROWN's is
        higher where the solver fails, and where the certificate's rounding and eigenvalue
        charges take it below CROWN's, e.g. on a net whose neurons are all stable)."""
        self.require_float64(graph, prop)
        crown = b.linear_boxes(graph, prop.lower, prop.upper)
        bound, _ = b.spec_lower(graph, crown, prop.spec)
        for s in range(len(prop)):
            qcqp = build(graph, [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in crown], self.pairs)
            for k, row in enumerate(prop.spec[s].double().cpu().numpy()):
                value = self.solve(qcqp, row)
                bound[s, k] = max(float(bound[s, k]), value)
        return bound, None

    def solve(self, qcqp: Qcqp, row: np.ndarray) -> float:
        """The primal SDP, then the certificate of its duals (-inf if it fails)."""
        cp = require_cvxpy(self.name)
        n, q = qcqp.size, qcqp.objective(row)
        p = cp.Variable((n, n), PSD=True)
        flat = cp.vec(p, order="C")
        lifted = [p[0, 0] == 1, qcqp.ineq @ flat >= 0]
        if qcqp.eq.shape[0]:
            lifted.append(qcqp.eq @ flat == 0)
        problem = cp.Problem(cp.Minimize(q @ flat), lifted)
        if not solved(problem, cp):
            return float("-inf")
        mu = lifted[1].dual_value
        lam = lifted[2].dual_value if len(lifted) > 2 else np.zeros(0)
        gamma = float(problem.value)
        # cvxpy's sign of an equality's dual is a convention: either sign is a sound
        # certificate, the better one is kept
        return max(certified_bound(qcqp, row, gamma, mu, sign * lam) for sign in (1.0, -1.0))
