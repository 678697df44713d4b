"""APGD's early stop with its batch in buckets (``apgd.BUCKETS``) against a new batch size at
almost every step, on the CPU: the same examples and step counts, the batch sizes each meets,
and the CPU time (one thread, interleaved rounds, paired medians).

On a GPU each new batch size costs cuDNN plans per convolution and direction; buckets keep
the sizes few (powers of two, shared across runs and targets) at the price of fooled rows
riding along frozen. A CPU has no plans to make, so the rows riding along are extra work
there: this bench measures that price and checks that the results do not move.

    OMP_NUM_THREADS=1 python bench/apgd_buckets.py --images 500 --steps 100 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import aisafety.attack.apgd as apgd
from aisafety.database.datasets.embedded import EmbeddedCifar10, EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.plugins import default_registry

MODES = {"off": False, "on": True}


def run(name: str, mode: str, predictor, x, y, eps: float, steps: int, sizes: list[int]):
    """``name`` with buckets ``mode``, recording each batch size the model is asked for."""
    apgd.BUCKETS = MODES[mode]
    attack = default_registry().create(
        "attack", name, {"steps": steps, "early_stop": True, "seed": 0}
    )
    logits = predictor._logits

    def watched(batch):
        sizes.append(len(batch))
        return logits(batch)

    predictor._logits = watched
    try:
        return attack(predictor, x, y, eps)
    finally:
        predictor._logits = logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mnist-cnn-pgd-at-ft2")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attacks", default="apgd-ce,apgd-t")
    args = parser.parse_args()
    torch.set_num_threads(1)
    source = EmbeddedCifar10() if args.model.startswith("cifar") else EmbeddedMnist()
    data = source.load(None, "test").balanced_subset(args.images, seed=0)
    predictor = load_zoo_model(args.model)
    print(f"{args.model}, {len(data.x)} images, l-inf {args.eps}, {args.steps} steps, torch "
          f"{torch.__version__}, 1 thread, CPU time")  # fmt: skip
    for name in args.attacks.split(","):
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        results, sizes = {}, {}
        for _ in range(args.rounds):
            for mode in MODES:
                sizes[mode] = []
                started = time.process_time()
                results[mode] = run(name, mode, predictor, data.x, data.y, args.eps,
                                    args.steps, sizes[mode])  # fmt: skip
                seconds[mode].append(time.process_time() - started)
        off, on = results["off"], results["on"]
        same = torch.equal(off.x_adv, on.x_adv) and torch.equal(off.steps, on.steps)
        ratio = statistics.median(a / b for a, b in zip(seconds["on"], seconds["off"], strict=True))
        for mode in MODES:
            robust = float((~results[mode].success).double().mean())
            print(f"{name} buckets {mode:3}: robust {robust:.3f}, {len(sizes[mode])} passes, "
                  f"{sum(sizes[mode])} sample-passes, {len(set(sizes[mode]))} distinct batch "
                  f"sizes, {statistics.median(seconds[mode]):.2f} CPU s")  # fmt: skip
        print(f"{name}: bit-identical examples and steps: {same}; CPU time on/off {ratio:.3f} "
              f"(paired median of {args.rounds})")  # fmt: skip
    apgd.BUCKETS = None


if __name__ == "__main__":
    main()
