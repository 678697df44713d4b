"""DeepZ with the generators' absolute sum carried between ops (session 14) against a
revision that sums them again in every op, paired.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/deepz_speed.py [PAIRS] [REVISION]

``REVISION`` (default bc7b0cb, session 13's last) gives the old ``zonotope.py``, loaded from
git beside the working tree's. Per network (mnistfc 256x2/4/6 at 0.03 and Conv-Small at 0.1
on 8 MNIST images): the paired median of CPU time new/old (interleaved, the order
alternating, one thread, a warm-up round first) and how far the bounds moved (new - old;
the carried sum is a little above the computed one, so the margin grows by ~1e-13 of it).
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

from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402
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


def row(name: str, graph, prop, ways: dict, pairs: int) -> None:
    ratios, low, high = [], float("inf"), -float("inf")
    for r in range(pairs + 1):  # the first round warms up
        order = ("new", "old") if r % 2 else ("old", "new")
        res = {way: timed(ways[way], graph, prop) for way in order}
        if r:
            ratios.append(res["new"][0] / res["old"][0])
        moved = res["new"][1] - res["old"][1]
        low, high = min(low, float(moved.min())), max(high, float(moved.max()))
    print(f"{name:<16} new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}), old {res['old'][0]:.3f} s; bounds moved {low:.2g} .. "
          f"{high:.2g}", flush=True)  # fmt: skip


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    revision = sys.argv[2] if len(sys.argv) > 2 else "bc7b0cb"
    ways = {"new": DeepZVerifier(), "old": old_module(revision).DeepZVerifier()}
    print(f"{setting()}; old = {revision}", flush=True)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:8], data.y[:8]
    for name, network, shape, eps in networks():
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        graph = build_graph(module, shape, name, dtype=torch.float64)
        row(name, graph, prop.to(graph.dtype), ways, pairs)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
