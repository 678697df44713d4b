"""CERTIFY's speed against its physical floor: the bare forward passes it needs.

    python bench/smoothing.py [--n 100000] [--n0 100] [--images 2] [--repeats 3]
                              [--batch 1000] [--threads 1] [--model mnist-cnn-gaussian-0.25]

CERTIFY (Cohen et al. 2019) on one image costs n0 + n forward passes of the base model on
noisy copies; everything else (drawing the noise, adding it, counting the votes, the
Clopper-Pearson bound) is overhead. The floor runs the same number of forward passes in
batches of the same size on one fixed, pre-drawn batch. Target: ours / floor <= 1.1.

Each repeat times ours and the floor back to back (interleaved, so a slow-down of the
shared machine hits both; which of the two runs first alternates), and the script prints
the median of the paired ratios next to the ratio of the minima.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.defense.smoothing.certify import certify


def floor(predictor, batch: torch.Tensor, passes: int) -> None:
    """``passes`` images' worth of bare forward passes, ``len(batch)`` at a time."""
    with torch.no_grad():
        for start in range(0, passes, len(batch)):
            predictor._logits(batch[: min(len(batch), passes - start)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mnist-cnn-gaussian-0.25")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_zoo_model(args.model)
    x = EmbeddedMnist().load(None, "test").x[: args.images]
    fixed = torch.randn(args.batch, *x.shape[1:]) * 0.25 + 0.5
    passes = args.images * (args.n0 + args.n)

    def ours(n: int = args.n) -> None:
        smoothed = RandomizedSmoothing(base, {"sigma": 0.25, "batch_size": args.batch})
        certify(smoothed, x, args.n0, n, 0.001)

    def bare() -> None:
        # Per image, as CERTIFY runs it: n0 then n draws, each in batches of --batch.
        for _ in range(args.images):
            floor(base, fixed, args.n0)
            floor(base, fixed, args.n)

    ours(min(args.n, 10 * args.batch))  # warm-up: allocator and kernels, not the full n
    print(f"load average {os.getloadavg()[0]:.1f} before the pairs")
    pairs = []
    for repeat in range(args.repeats):
        # Alternate which half runs first: on a machine whose load drifts, the first half
        # of every pair would otherwise always see the busier (or quieter) machine.
        order = (ours, bare) if repeat % 2 == 0 else (bare, ours)
        seconds = {}
        for run in order:
            started = time.perf_counter()
            run()
            seconds[run] = time.perf_counter() - started
        times = [seconds[ours], seconds[bare]]
        pairs.append(times)
        first = "ours" if order[0] is ours else "floor"
        print(
            f"  ours {times[0]:8.2f} s   floor {times[1]:8.2f} s   "
            f"ratio {times[0] / times[1]:.3f}   ({first} first)"
        )
    best_ours, best_floor = min(p[0] for p in pairs), min(p[1] for p in pairs)
    print(
        f"CERTIFY n0={args.n0} n={args.n} on {args.images} image(s) of {args.model}, "
        f"{passes:,} forward passes in batches of {args.batch}, {args.threads} thread(s):\n"
        f"  ours {passes / best_ours:9.0f} img/s   floor {passes / best_floor:9.0f} img/s   "
        f"ratio of minima {best_ours / best_floor:.3f}   "
        f"median paired ratio {statistics.median(p[0] / p[1] for p in pairs):.3f}   "
        f"(target <= 1.1); load average {os.getloadavg()[0]:.1f} after"
    )


if __name__ == "__main__":
    main()
