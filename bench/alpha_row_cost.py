"""The cost of docs/cifar10.md's resnet_2b verifier row, and what it ran: CPU seconds, Adam
steps taken, verdicts and peak resident size, under a chosen per-image limit and clock.

    OMP_NUM_THREADS=1 PYTHONPATH=<tree> python bench/alpha_row_cost.py [--images 10]
        [--timeout 1e6] [--clock cpu] [--memory-gib 3] [--verifier alpha-crown]

The row's plan (``certified-accuracy`` at 1/255 on ``cifar10-embedded``, batch 50, PGD
first) through ``aisafety.evaluate``, one thread. Every ``torch.optim.Adam.step`` is
counted, so a run whose slope searches a time limit cut short shows fewer steps: comparing
two commits' CPU seconds means anything only at the same step count. Written to run on old
commits too (``git worktree add`` of the commit, ``PYTHONPATH`` pointing at it): it uses
only ``aisafety.evaluate`` and the plan's fields that existed on 26 Nov 2026 morning.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def counting_adam_steps() -> Counter:
    """Count every Adam step of this process (the slope searches' steps)."""
    steps: Counter = Counter()
    step = torch.optim.Adam.step

    def counted(self, *args, **kwargs):
        steps["adam"] += 1
        return step(self, *args, **kwargs)

    torch.optim.Adam.step = counted
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1e6, help="seconds per image")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    parser.add_argument("--memory-gib", type=float, default=3.0)
    parser.add_argument("--verifier", default="alpha-crown")
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = counting_adam_steps()
    import aisafety

    net = shared_data("cifar10-models") / "vnncomp2021_cifar10_resnet" / "resnet_2b.onnx"
    config = {"timeout": args.timeout, "clock": args.clock}
    plan = {
        "model": {"name": "resnet_2b", "source": "onnx", "path": str(net),
                  "gradients": True, "mean": [0.4914, 0.4822, 0.4465],
                  "std": [0.2471, 0.2435, 0.2616]},
        "dataset": {"name": "cifar10-embedded", "limit": args.images},
        "metrics": [{"name": "certified-accuracy", "config": {
            "eps": 1 / 255, "verifier": args.verifier, "verifier_config": config}}],
        "batch_size": 50, "seed": 0, "limits": {"memory_gib": args.memory_gib},
    }  # fmt: skip
    db = f"sqlite:////tmp/alpha_row_cost-{os.getpid()}.db"
    began = time.process_time()
    try:
        value = aisafety.evaluate(plan, db=db).values[0]
    finally:
        os.remove(db[len("sqlite:///") :])
    cpu = time.process_time() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    extra = value.details
    verdicts = {k: extra.get(k) for k in ("falsified", "unknown", "timeout")}
    print(
        f"{aisafety.__file__}: {args.verifier} {value.value} @ 1/255 on {args.images} images, "
        f"{cpu:.1f} CPU s, {steps['adam']} Adam steps, peak {peak:.0f} MiB, {verdicts}"
    )


if __name__ == "__main__":
    main()
