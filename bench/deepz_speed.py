"""DeepZ with the generators' absolute sum carried between ops (session 14) against a
revision that sums them again in every op, paired.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/deepz_speed.py [PAIRS] [REVISION]

``REVISION`` (default 3359b22, main before the change; session 14 measured against bc7b0cb,
whose ``zonotope.py`` differs only by calling ``Conv._conv``, since renamed ``conv``) gives
the old ``zonotope.py``, loaded from git beside the working tree's. Per network (mnistfc
256x2/4/6 at 0.03 and Conv-Small at 0.1 on 8 MNIST images): the paired median of CPU time
new/old (interleaved, the order alternating, one thread, a warm-up round first) and the
largest difference of the bounds (the carried sum is a little above the computed one: the
margin grows by ~1e-13 of it).
"""

from __future__ import annotations

import subprocess
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bound_speed import float64_cases  # noqa: E402
from float64_margin import setting  # noqa: E402
from paired import compare_new_old  # noqa: E402

from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.verification.zonotope import DeepZVerifier  # noqa: E402


def old_module(revision: str) -> types.ModuleType:
    """``zonotope.py`` as it was at ``revision``, as a module of its own."""
    path = "aisafety/verification/zonotope.py"
    source = subprocess.run(["git", "show", f"{revision}:{path}"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    module = types.ModuleType("zonotope_old")
    exec(compile(source, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def timed(verifier, graph, prop) -> tuple[float, torch.Tensor]:
    start = time.process_time()
    with torch.no_grad(), reuse_freed_memory():
        bound = verifier.lower_bounds(graph, prop)[0]
    return time.process_time() - start, bound


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    revision = sys.argv[2] if len(sys.argv) > 2 else "3359b22"
    ways = {"new": DeepZVerifier(), "old": old_module(revision).DeepZVerifier()}
    print(f"{setting()}; old = {revision}", flush=True)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:8], data.y[:8]
    for name, graph, prop in float64_cases(x, y):
        compare_new_old(name, lambda way: timed(ways[way], graph, prop), pairs)  # noqa: B023
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
