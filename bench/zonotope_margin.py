"""DeepZ with and without its float64 rounding radius (``zonotope.py``), against the code
before it (commit 32ec4fe's parent, loaded from git into the same process).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/zonotope_margin.py [PAIRS] [IMAGES]

Per network (mnistfc 256x2 at 0.03, Conv-Small at 0.1, the first IMAGES MNIST images): the
paired median of CPU time new/old (interleaved, the order alternating, one thread) and how
far every bound moved down.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bound_speed import networks, normalised, plain_module  # noqa: E402
from float64_margin import setting  # noqa: E402

from aisafety.verification import zonotope  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402

BEFORE = "32ec4fe~1"


def old_module() -> types.ModuleType:
    """``zonotope.py`` as it was before its rounding radius."""
    root = Path(__file__).parent.parent
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:aisafety/verification/zonotope.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("zonotope_before")
    exec(compile(source, "zonotope_before.py", "exec"), module.__dict__)
    return module


def run(verifier, graph, prop) -> tuple[float, torch.Tensor]:
    start = time.process_time()
    with torch.no_grad():
        bound, _ = verifier.lower_bounds(graph, prop.to(graph.dtype))
    return time.process_time() - start, bound.double()


def row(name: str, graph, prop, pairs: int, old_verifier) -> None:
    new_verifier = zonotope.DeepZVerifier()
    ratios, low, high = [], float("inf"), -float("inf")
    for r in range(pairs):
        order = (True, False) if r % 2 else (False, True)
        res = {new: run(new_verifier if new else old_verifier, graph, prop) for new in order}
        ratios.append(res[True][0] / res[False][0])
        moved = res[False][1] - res[True][1]
        low, high = min(low, float(moved.min())), max(high, float(moved.max()))
    old = res[False][1]
    print(f"{name:<16} new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}), old {res[False][0]:.2f} s; bounds moved down by {low:.2g} .. "
          f"{high:.2g} (bounds {float(old.min()):.4g} .. {float(old.max()):.4g})",
          flush=True)  # fmt: skip


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    images = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    print(setting(), flush=True)
    old_verifier = old_module().DeepZVerifier()
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:images], data.y[:images]
    for name, network, shape, eps in networks():
        if "256x4" in name or "256x6" in name:
            continue
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        row(name, build_graph(module, shape, name, dtype=torch.float64), prop, pairs, old_verifier)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
