"""CROWN with and without the float64 passes' rounding margin (``float64_margin.py``).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/float64_margin.py [MNIST_PAIRS] [RESNET_PAIRS]

Per network (mnistfc 256x2/4/6 at 0.03 and Conv-Small at 0.1 on 8 MNIST images; resnet_2b
on 2 CIFAR images at 2/255): the paired median of CPU time new/old (interleaved, the order
alternating, one thread) and how far every bound moved down (never up).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bound_speed import networks, normalised, plain_module  # noqa: E402
from resnet_crown_lirpa import cifar_images  # noqa: E402
from resnet_crown_speed import nets  # noqa: E402

from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.verification import float64_margin  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.incomplete import CrownVerifier  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402

APPLIES = float64_margin.applies


def setting() -> str:
    lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    cpu = next(line for line in lines if "Model name" in line).split(":")[1].strip()
    when = time.strftime("%H:%M:%S", time.gmtime())
    return f"CPU {cpu}, load {os.getloadavg()[0]:.2f}, {when} UTC, torch {torch.__version__}"


def run(graph, prop, margin: bool) -> tuple[float, torch.Tensor]:
    float64_margin.applies = APPLIES if margin else (lambda a: False)
    try:
        start = time.process_time()
        with torch.no_grad(), reuse_freed_memory():
            bound, _ = CrownVerifier().lower_bounds(graph, prop.to(graph.dtype))
        return time.process_time() - start, bound.double()
    finally:
        float64_margin.applies = APPLIES


def row(name: str, graph, prop, pairs: int) -> None:
    ratios, low, high, rel = [], float("inf"), -float("inf"), 0.0
    for r in range(pairs):
        order = (True, False) if r % 2 else (False, True)
        res = {margin: run(graph, prop, margin) for margin in order}
        ratios.append(res[True][0] / res[False][0])
        moved = res[False][1] - res[True][1]
        low, high = min(low, float(moved.min())), max(high, float(moved.max()))
        rel = max(rel, float((moved / (1 + res[False][1].abs())).max()))
    old = res[False][1]
    print(f"{name:<16} new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}), old {res[False][0]:.2f} s; bounds moved down by {low:.2g} .. "
          f"{high:.2g} (<= {rel:.2g} of 1 + |bound|; bounds {float(old.min()):.4g} .. "
          f"{float(old.max()):.4g})", flush=True)  # fmt: skip


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    mnist_pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    resnet_pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    print(setting(), flush=True)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:8], data.y[:8]
    for name, network, shape, eps in networks():
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        row(name, build_graph(module, shape, name, dtype=torch.float64), prop, mnist_pairs)
    cx, cy = cifar_images([0, 1])
    graph, _, _ = nets("resnet_2b")
    row("resnet_2b 2/255", graph, robustness_property(cx, cy, 2 / 255, 10), resnet_pairs)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
