"""CROWN with a first convolution's backward rule as a product and ``F.fold``
(``ops.Conv._folded``, session 14) against ``conv_transpose2d``, paired.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/conv_fold_speed.py [PAIRS]

Conv-Small (``sok-cnn-a-adv1``: its first convolution has one input channel) at 0.1 on 8
MNIST images, CROWN as shipped and with every pass in float64: the paired median of CPU
time new/old (old: ``ops.FOLD_CHANNELS = 0``; interleaved, the order alternating, one
thread, a warm-up round first) and the largest difference of the bounds.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bound_speed import networks, normalised, plain_module  # noqa: E402
from float64_margin import setting  # noqa: E402

from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.verification import ops, rounding  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.incomplete import CrownVerifier  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402

KEPT = ops.FOLD_CHANNELS


def timed(new: bool, graph, prop, precision: str) -> tuple[float, torch.Tensor]:
    ops.FOLD_CHANNELS = KEPT if new else 0
    try:
        start = time.process_time()
        with torch.no_grad(), reuse_freed_memory(), rounding.pass_precision(precision):
            bound = CrownVerifier().lower_bounds(graph, prop)[0]
        return time.process_time() - start, bound.double()
    finally:
        ops.FOLD_CHANNELS = KEPT


def row(name: str, graph, prop, precision: str, pairs: int) -> None:
    ratios, diff = [], 0.0
    for r in range(pairs + 1):  # the first round warms up
        order = (True, False) if r % 2 else (False, True)
        res = {new: timed(new, graph, prop, precision) for new in order}
        if r:
            ratios.append(res[True][0] / res[False][0])
        diff = max(diff, float((res[True][1] - res[False][1]).abs().max()))
    print(f"{name:<28} new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}), old {res[False][0]:.3f} s; bounds differ by <= {diff:.2g}",
          flush=True)  # fmt: skip


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    print(setting(), flush=True)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:8], data.y[:8]
    name, network, shape, eps = networks()[-1]
    prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
    prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
    graph = build_graph(module, shape, name, dtype=torch.float64)
    for precision in ("auto", "float64"):
        row(f"{name} CROWN {precision}", graph, prop.to(graph.dtype), precision, pairs)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
