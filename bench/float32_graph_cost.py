"""What bounding a float32 graph as its float64 copy costs (``Verifier.verify`` since
session 16; docs/certification.md, "Differential fuzzing").

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/float32_graph_cost.py [PAIRS]

CROWN's and IBP's ``lower_bounds`` of 16 samples at eps 0.01 on the float32 graph itself
(before: no rounding margins; ``lower_bounds`` refuses it since session 18, so the
bench skips that check) and on its float64 copy (now), interleaved, CPU time, one
thread: per net and verifier the median ratio now/before and its range.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from aisafety.database.scaled_mlp import scaled_mlp
from aisafety.database.small_residual import small_residual
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import CrownVerifier, IBPVerifier
from aisafety.verification.property import robustness_property

NETS = [
    ("small_residual", small_residual(), (3, 16, 16)),
    ("mlp 16-64-64-10", scaled_mlp(0, 2.0, [16, 64, 64, 10], [torch.nn.ReLU] * 2), (1, 4, 4)),
]


def seconds(verifier, graph, prop) -> float:
    began = time.process_time()
    verifier.lower_bounds(graph, prop)
    return time.process_time() - began


def main(pairs: int) -> None:
    torch.set_num_threads(1)
    for label, net, shape in NETS:
        graph = build_graph(net, shape, label, dtype=torch.float32)
        x = torch.rand(16, *shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            outputs = net(x)
        prop = robustness_property(x, outputs.argmax(1), 0.01, outputs.shape[1])
        narrow, wide = prop.to(torch.float32), graph.in_dtype(torch.float64)
        for name, verifier in [("crown", CrownVerifier()), ("ibp", IBPVerifier())]:
            # before: the float32 graph bounded as it is (session 18 refuses it: no margin)
            verifier.require_float64 = lambda graph, prop: None
            ratios = [
                seconds(verifier, wide, prop) / seconds(verifier, graph, narrow)
                for _ in range(pairs)
            ]
            spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
            print(f"{label} {shape} {name}: now/before {statistics.median(ratios):.3f} ({spread})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
