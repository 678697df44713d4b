"""SDPVerify's and LMIVerify's proved certificate (``quadratic.certified_bound``: shifted
Cholesky, every rounding charged) against the earlier check (eigvalsh, fixed 1e-12 and 1e-9
margins), on the orderings test's steep 16-12-12-3 nets: paired CPU time of
``lower_bounds`` and how far the bounds moved (new - old; the solves are the same).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python3 bench/sdp_certificate_speed.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from paired import interleaved, one_thread, paired_median
from torch import nn

from aisafety.database.scaled_mlp import scaled_mlp
from aisafety.plugins import default_registry
from aisafety.verification import lmi, sdp
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier


def earlier_bound(qcqp, row, gamma, mu, lam) -> float:
    """The check before session 15, for comparison only."""
    q = qcqp.objective(row)
    mu = np.maximum(np.asarray(mu, dtype=np.float64).ravel(), 0.0)
    lam = np.asarray(lam, dtype=np.float64).ravel()
    f = q - qcqp.ineq.T @ mu - (qcqp.eq.T @ lam if len(lam) else 0.0)
    f = f.reshape(qcqp.size, qcqp.size)
    f = (f + f.T) / 2
    f[0, 0] -= gamma
    smallest = float(np.linalg.eigvalsh(f)[0])
    return gamma + min(smallest, 0.0) * qcqp.radius2 * (1 + 1e-9) - 1e-12 * (1 + abs(gamma))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    print(one_thread())
    proved = sdp.certified_bound
    for seed, eps in ((2, 0.05), (7, 0.1)):
        net = scaled_mlp(seed, 2.0, [16, 12, 12, 3], [nn.ReLU, nn.ReLU])  # test_orderings
        graph = build_graph(net, (1, 4, 4), "steep")
        x = torch.rand(args.samples, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            prop = robustness_property(x, net(x).argmax(1), eps, 3)
        for module, name in ((sdp, "sdpverify"), (lmi, "lmiverify")):
            verifier = make_verifier(default_registry(), name)

            def run(way: str, module=module, verifier=verifier, prop=prop, graph=graph):
                module.certified_bound = proved if way == "new" else earlier_bound
                began = time.process_time()
                with torch.no_grad():
                    bound = verifier.lower_bounds(graph, prop)[0]
                return time.process_time() - began, bound

            results = interleaved(("new", "old"), run, args.pairs)
            module.certified_bound = proved
            new, old = ([t for t, _ in results[w]] for w in ("new", "old"))
            moved = results["new"][-1][1] - results["old"][-1][1]
            print(f"seed {seed} eps {eps} {name:<10} new/old CPU {paired_median(new, old):.3f}"
                  f" (old {old[-1]:.2f} s); new - old: {float(moved.min()):.3g} .. "
                  f"{float(moved.max()):.3g}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
