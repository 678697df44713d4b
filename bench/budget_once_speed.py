"""CROWN called on its own with the memory budget read (and claimed in the ledger) once per
bound computation against once per chunk sizing, as before session 14's ledger-14, paired.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/budget_once_speed.py [PAIRS]

Per network (mnistfc 256x2/4/6 at 0.03 and Conv-Small at 0.1 on 8 MNIST images): CROWN as
shipped, ``CrownVerifier.lower_bounds`` outside ``verify`` (as ``bench/bound_speed.py`` and
VNN-COMP's first passes call it); "old" runs the undecorated ``lower_bounds`` and
``linear_boxes`` (``__wrapped__``), which read the budget at every ``rows_per_chunk``. The
paired median of CPU time new/old (interleaved, the order alternating, one thread), how many
ledger claims each makes, and the largest difference of the bounds (none expected).
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

from aisafety import memory_ledger  # noqa: E402
from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.verification import bounds  # noqa: E402
from aisafety.verification.incomplete import CrownVerifier  # noqa: E402

NEW = (CrownVerifier.lower_bounds, bounds.linear_boxes)
OLD = tuple(f.__wrapped__ for f in NEW)


def use(way: str) -> None:
    CrownVerifier.lower_bounds, bounds.linear_boxes = NEW if way == "new" else OLD


def timed(way: str, graph, prop) -> tuple[float, torch.Tensor]:
    use(way)
    try:
        start = time.process_time()
        with torch.no_grad(), reuse_freed_memory():
            out = CrownVerifier().lower_bounds(graph, prop)[0]
        return time.process_time() - start, out
    finally:
        use("new")


def claims(way: str, graph, prop) -> int:
    """How many times one call claims its budget in the ledger."""
    count, claim = [0], memory_ledger.claim

    def counting(budget_of):
        count[0] += 1
        return claim(budget_of)

    memory_ledger.claim = counting
    try:
        timed(way, graph, prop)
    finally:
        memory_ledger.claim = claim
    return count[0]


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    print(setting(), flush=True)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:8], data.y[:8]
    for name, graph, prop in float64_cases(x, y):
        counts = f"claims new {claims('new', graph, prop)} old {claims('old', graph, prop)}"
        compare_new_old(f"{name} ({counts})", lambda way, g=graph, p=prop: timed(way, g, p), pairs)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
