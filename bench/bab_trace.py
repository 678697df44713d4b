"""Where one mnistfc instance's ``bab`` search spends its CPU time, round by round.

    python bench/bab_trace.py [--net 256x4] [--prop prop_5_0.03] [--seconds 60]
                              [--every 10] [--config root_steps=0 ...]

The root is bounded once (CROWN, alpha-CROWN; box-PGD skipped), then ``Search`` runs on the
CPU clock for ``--seconds`` (the root's slope step included, as in ``bab``). Printed every
``--every`` rounds: CPU seconds, rounds, domains bounded so far and per CPU second, open
domains, the lowest and the highest open bound, and domains pruned as empty; at the end
the verdict and the root's worst row. Work is bounded by CPU time, so the numbers depend
on the load (printed with the CPU model).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bab_speed import cpu_model, setup  # noqa: E402
from verification import parse_verifier  # noqa: E402


def traced_search(network, prop, root, boxes, config, seconds: float, every: int):
    """Run ``Search`` for ``seconds`` of CPU, printing its state every ``every`` rounds."""
    from aisafety.verification.bab import Search
    from aisafety.verification.deadline import CLOCKS, Deadline

    start = time.process_time()

    class Traced(Search):
        bounded = 0
        empty = 0

        def _bound_and_prune(self, todo):
            self.bounded += len(todo)
            return super()._bound_and_prune(todo)

        def _next_round(self):
            if self.rounds % every == 0:
                self.report()
            return super()._next_round()

        def report(self):
            spent = time.process_time() - start
            d = self.open
            low = f"{d.bound.min():.4f}" if d is not None and len(d) else "-"
            high = f"{d.bound.max():.4f}" if d is not None and len(d) else "-"
            n = len(d) if d is not None else 0
            print(f"  {spent:6.1f} s  round {self.rounds:4d}  bounded {self.bounded:6d} "
                  f"({self.bounded / max(spent, 1e-9):5.0f}/s)  open {n:5d}  lowest {low}  "
                  f"highest {high}", flush=True)  # fmt: skip

    deadline = Deadline(CLOCKS["cpu"]() + seconds, CLOCKS["cpu"])
    search = Traced(config, network.graph, prop, boxes, network.run, deadline)
    outcome = search.run(root)
    search.report()
    return outcome, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--net", default="256x4")
    parser.add_argument("--prop", default="prop_5_0.03")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--config", default="", help="bab options, key=value,key=value")
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, config = parse_verifier(f"bab:{args.config}")
    network, prop, root, boxes, cfg = setup(args.net, args.prop, {"clock": "cpu", **config})
    print(f"{args.net} {args.prop}, {args.seconds:g} CPU s, options {config or 'default'}, "
          f"one thread; CPU {cpu_model()}; load {os.getloadavg()[0]:.1f}; "
          f"alpha-CROWN's worst row {root.min():.4f}", flush=True)  # fmt: skip
    outcome, spent = traced_search(network, prop, root, boxes, cfg, args.seconds, args.every)
    verdict = "sat" if outcome.point is not None else ("unsat" if not outcome.why else outcome.why)
    print(f"{verdict} after {spent:.1f} CPU s; bounds {outcome.bounds.min():.4f} (worst row); "
          f"load at end {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
