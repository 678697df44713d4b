"""Throughput of every corruption: images per second on 1,000 MNIST test images.

    python bench/corruptions.py [--severity 3] [--threads 2] [--device cpu] [--repeat 3]
                                [--sequences]

Runs each corruption once to warm up, then ``--repeat`` times, and reports the best run
(the least disturbed by other work on the machine). Corruptions under ``--target`` images/s
(default 1,000) are flagged with ``SLOW``; the exit status is 0 either way, so the script can
run in CI as a report. ``--sequences`` also times the perturbation sequences (31 frames).
"""

from __future__ import annotations

import argparse
import time

import torch

from aisafety.corruption import CORRUPTIONS, SEQUENCES, corrupt, sequence
from aisafety.database.datasets.embedded import EmbeddedMnist


def best_seconds(run, repeat: int, device: torch.device) -> float:
    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    once()  # warm-up: caches, lazy initialisation
    return min(once() for _ in range(repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--severity", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", type=float, default=1000.0, help="images/s to flag below")
    parser.add_argument("--sequences", action="store_true", help="also time the sequences")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    x = EmbeddedMnist().load(None, "test").x.to(device)
    n = len(x)
    print(
        f"{n} MNIST images {tuple(x.shape[1:])}, severity {args.severity}, device {device}, "
        f"{torch.get_num_threads()} CPU threads, best of {args.repeat}"
    )
    print(f"{'corruption':<20}{'images/s':>12}")
    slow = []
    for name in CORRUPTIONS:

        def run(name: str = name) -> None:
            corrupt(x, name, args.severity)

        seconds = best_seconds(run, args.repeat, device)
        rate = n / seconds
        flag = "  SLOW" if rate < args.target else ""
        slow += [name] if flag else []
        print(f"{name:<20}{rate:>12,.0f}{flag}")
    if args.sequences:
        print(f"\n{'sequence (31 frames)':<20}{'images/s':>12}")
        for name in SEQUENCES:
            seconds = best_seconds(lambda name=name: sequence(x, name, 31), args.repeat, device)
            print(f"{name:<20}{n / seconds:>12,.0f}")
    summary = ", ".join(slow) if slow else "none"
    print(f"\nunder {args.target:,.0f} images/s: {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
