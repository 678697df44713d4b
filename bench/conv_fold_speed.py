"""CROWN with a first convolution's backward rule as a product and ``F.fold``
(``ops.Conv._folded``, session 14) against ``conv_transpose2d``, paired.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/conv_fold_speed.py [PAIRS]

Conv-Small (``sok-cnn-a-adv1``: its first convolution has one input channel) at 0.1 on 8
MNIST images, CROWN as shipped and with every pass in float64: the paired median of CPU
time new/old (old: ``ops.FOLD_CHANNELS = 0``; interleaved, the order alternating, one
thread, a warm-up round first) and the largest difference of the bounds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bound_speed import float64_cases  # noqa: E402
from float64_margin import setting  # noqa: E402
from paired import compare_new_old  # noqa: E402

from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.verification import ops, rounding  # noqa: E402
from aisafety.verification.incomplete import CrownVerifier  # noqa: E402

KEPT = ops.FOLD_CHANNELS


def timed(way: str, graph, prop, precision: str) -> tuple[float, torch.Tensor]:
    ops.FOLD_CHANNELS = KEPT if way == "new" else 0
    try:
        start = time.process_time()
        with torch.no_grad(), reuse_freed_memory(), rounding.pass_precision(precision):
            bound = CrownVerifier().lower_bounds(graph, prop)[0]
        return time.process_time() - start, bound.double()
    finally:
        ops.FOLD_CHANNELS = KEPT


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    print(setting(), flush=True)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:8], data.y[:8]
    name, graph, prop = list(float64_cases(x, y))[-1]  # Conv-Small
    for precision in ("auto", "float64"):
        run = lambda way: timed(way, graph, prop, precision)  # noqa: B023, E731
        compare_new_old(f"{name} CROWN {precision}", run, pairs)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
