"""DeepZ, FastLip and RecurJac with their float64 rounding margins (``zonotope.py``,
``lipschitz_rounding.py``) against the code before them (commit 32ec4fe's parent, the
modules loaded from git into the same process).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/verifier_margins.py [PAIRS] [IMAGES]

Per network (mnistfc 256x2 at 0.03, Conv-Small (sok-cnn-a-adv1) at 0.1, the first IMAGES
MNIST images; RecurJac on 256x2 only): the paired median of CPU time new/old (interleaved,
the order alternating, one thread) and how far every bound moved down.
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

from aisafety.verification import lipschitz, recurjac, zonotope  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402

BEFORE = "32ec4fe~1"


def old_module(name: str) -> types.ModuleType:
    """``aisafety/verification/{name}.py`` as it was before its rounding margins."""
    root = Path(__file__).parent.parent
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:aisafety/verification/{name}.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType(f"{name}_before")
    exec(compile(source, f"{name}_before.py", "exec"), module.__dict__)
    return module


def run(verifier, graph, prop) -> tuple[float, torch.Tensor]:
    start = time.process_time()
    with torch.no_grad():
        bound, _ = verifier.lower_bounds(graph, prop.to(graph.dtype))
    return time.process_time() - start, bound.double()


def row(name: str, graph, prop, pairs: int, new_verifier, old_verifier) -> None:
    ratios, low, high = [], float("inf"), -float("inf")
    for r in range(pairs):
        order = (True, False) if r % 2 else (False, True)
        res = {new: run(new_verifier if new else old_verifier, graph, prop) for new in order}
        ratios.append(res[True][0] / res[False][0])
        moved = res[False][1] - res[True][1]
        low, high = min(low, float(moved.min())), max(high, float(moved.max()))
    old = res[False][1]
    print(f"{name:<24} new/old {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}), old {res[False][0]:.2f} s; bounds moved down by {low:.2g} .. "
          f"{high:.2g} (bounds {float(old.min()):.4g} .. {float(old.max()):.4g})",
          flush=True)  # fmt: skip


def main() -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist

    torch.set_num_threads(1)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    images = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    print(setting(), flush=True)
    lipschitz_before = old_module("lipschitz")
    sys.modules["aisafety.verification.lipschitz"] = lipschitz_before  # recurjac's import
    recurjac_before = old_module("recurjac")
    sys.modules["aisafety.verification.lipschitz"] = lipschitz
    pairs_of = [
        ("deepz", zonotope.DeepZVerifier(), old_module("zonotope").DeepZVerifier()),
        ("fastlip", lipschitz.FastLipVerifier(), lipschitz_before.FastLipVerifier()),
        ("recurjac", recurjac.RecurJacVerifier(), recurjac_before.RecurJacVerifier()),
    ]
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:images], data.y[:images]
    for name, network, shape, eps in networks():
        if "256x4" in name or "256x6" in name:
            continue
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        graph = build_graph(module, shape, name, dtype=torch.float64)
        for verifier, new, old in pairs_of:
            if verifier != "recurjac" or name == "256x2":
                row(f"{verifier} {name}", graph, prop, pairs, new, old)
    print(setting(), flush=True)


if __name__ == "__main__":
    main()
