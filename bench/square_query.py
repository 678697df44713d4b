"""The host's work per Square query, per redraw path, on the CPU: a proxy for a GPU's.

On a GPU with a small model a Square query is bound by the host: the operations it
launches and the synchronisations that make the host wait for the device. This bench runs
``square-linf`` with each redraw path (``square.REDRAWS``: "loop", the reference's one-by-one
loop; "host", read-ahead on the host, the CPU's default; "device", every candidate gathered on
the device, a GPU's default) and prints, per query:

- the top-level aten operations (``torch.profiler``; on a GPU each that computes is a kernel
  launch) and those that read a value back on a GPU (``item``/``nonzero``: synchronisations;
  the copies between host and device that synchronise are listed by code reading in
  docs/gpu.md, as a CPU run has none);
- the CPU time per query, interleaved rounds, paired medians against "host", on a tiny model
  (a linear layer: the host's work dominates, as a launch-bound GPU's);
- that every path gives the same examples and query counts (and the robust accuracy).

    OMP_NUM_THREADS=1 python bench/square_query.py --images 100 --queries 300 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import aisafety.attack.square as square
from aisafety.attack.square import SquareLinf
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.prediction.torch_module import TorchPredictor

PATHS = ("loop", "host", "device")
SYNCING = ("aten::_local_scalar_dense", "aten::nonzero", "aten::item")
# operations that only make a view or read metadata: no kernel on a GPU
_VIEW_NAMES = (
    "view", "unsqueeze", "squeeze", "select", "slice", "expand", "detach", "detach_",
    "resolve_conj", "resolve_neg", "lift_fresh", "flatten", "unbind", "reshape", "alias",
    "as_strided", "t", "permute", "split", "is_nonzero",
)  # fmt: skip
VIEWS = {f"aten::{name}" for name in _VIEW_NAMES}


def run(path: str, predictor, x, y, eps: float, queries: int):
    square.REDRAWS = path
    return SquareLinf(queries=queries, seed=0)(predictor, x, y, eps)


def op_counts(path: str, predictor, x, y, eps: float, queries: int) -> tuple[float, ...]:
    """Top-level aten operations per query: all, those that compute, those that read a value
    back, and the queries run."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = run(path, predictor, x, y, eps, queries)
    top = Counter()
    for event in prof.events():
        if event.name.startswith("aten::") and (
            event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")
        ):
            top[event.name] += 1
    spent = int(result.steps.max())  # queries run (the loop stops when all are fooled)
    syncs = sum(top[name] for name in SYNCING)
    compute = sum(count for name, count in top.items() if name not in VIEWS)
    return sum(top.values()) / spent, compute / spent, syncs / spent, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mnist-cnn-pgd-at-ft2")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = EmbeddedMnist().load(None, "test").balanced_subset(args.images, seed=0)
    zoo = load_zoo_model(args.model)
    torch.manual_seed(0)
    tiny = TorchPredictor(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), (1, 28, 28), 10)
    tiny_y = tiny.predict(data.x)
    print(f"{args.images} images, {args.queries} queries, l-inf {args.eps}, torch "
          f"{torch.__version__}, 1 thread")  # fmt: skip

    results = {p: run(p, zoo, data.x, data.y, args.eps, args.queries) for p in PATHS}
    for path, result in results.items():
        same = torch.equal(result.x_adv, results["loop"].x_adv) and torch.equal(
            result.steps, results["loop"].steps
        )
        robust = float((~result.success).double().mean())
        print(f"{args.model} {path:6}: robust {robust:.3f}, identical to loop: {same}")

    for path in PATHS:
        ops, compute, syncs, spent = op_counts(path, tiny, data.x, tiny_y, 0.02, args.queries)
        print(f"tiny model {path:6}: {ops:.1f} top-level aten ops ({compute:.1f} that compute) "
              f"and {syncs:.2f} value reads per query ({spent} queries)")  # fmt: skip

    seconds: dict[str, list[float]] = {p: [] for p in PATHS}
    for _ in range(args.rounds):
        for path in PATHS:
            started = time.process_time()
            result = run(path, tiny, data.x, tiny_y, 0.02, args.queries)
            seconds[path].append((time.process_time() - started) / int(result.steps.max()))
    for path in PATHS:
        ratio = statistics.median(
            a / b for a, b in zip(seconds[path], seconds["host"], strict=True)
        )
        print(f"tiny model {path:6}: {statistics.median(seconds[path]) * 1e6:.1f} CPU us per "
              f"query, {ratio:.3f}x host's (paired median of {args.rounds})")  # fmt: skip
    square.REDRAWS = None


if __name__ == "__main__":
    main()
