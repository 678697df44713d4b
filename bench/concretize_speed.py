"""CROWN with ``bounds.concretize`` as two batched products against the elementwise form it
replaced (session 14), paired.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/concretize_speed.py [PAIRS]

First ``concretize`` alone on 8 x 512 rows of 784 (float64), then per network (mnistfc
256x2/4/6 at 0.03 and Conv-Small at 0.1 on 8 MNIST images) CROWN as shipped (float32
intermediate passes, float64 final pass) and with every pass in float64
(``pass_precision("float64")``, where every pass ends in ``concretize``): the paired median
of CPU time new/old (interleaved, the order alternating, one thread) and the largest
difference of the bounds (the two forms sum the same products in another order).
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
from aisafety.verification import bounds, rounding  # noqa: E402
from aisafety.verification.incomplete import CrownVerifier  # noqa: E402
from aisafety.verification.ops import split_signs  # noqa: E402

NEW = bounds.concretize


def elementwise(a: torch.Tensor, box) -> torch.Tensor:
    """The form before session 14: the products as tensors, then summed."""
    pos, neg = split_signs(a)
    dims = tuple(range(2, a.dim()))
    return (pos * box[0].unsqueeze(1)).sum(dims) + (neg * box[1].unsqueeze(1)).sum(dims)


def timed(way: str, call) -> tuple[float, torch.Tensor]:
    bounds.concretize = NEW if way == "new" else elementwise
    try:
        start = time.process_time()
        with torch.no_grad(), reuse_freed_memory():
            out = call()
        return time.process_time() - start, out
    finally:
        bounds.concretize = NEW


def row(name: str, call, pairs: int) -> None:
    compare_new_old(name, lambda way: timed(way, call), pairs)


def crown(graph, prop, precision: str):
    def call() -> torch.Tensor:
        with rounding.pass_precision(precision):
            return CrownVerifier().lower_bounds(graph, prop)[0].double()

    return call


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print(setting(), flush=True)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 512, 784, generator=g, dtype=torch.float64)
    lo = torch.rand(8, 784, generator=g, dtype=torch.float64)
    row("concretize 8x512x784", lambda: bounds.concretize(a, (lo, lo + 0.1)), pairs)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:8], data.y[:8]
    for name, graph, prop in float64_cases(x, y):
        for precision in ("auto", "float64"):
            row(f"{name} CROWN {precision}", crown(graph, prop, precision), pairs)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
