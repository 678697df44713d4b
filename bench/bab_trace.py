"""What ``bab`` does on one VNN-COMP instance, round by round: where its CPU time goes.

    python bench/bab_trace.py [--suite mnistfc] [--net 256x4] [--prop prop_5_0.03]
                              [--timeout 60] [--verifier bab:root_steps=0] [--every 10]

Runs ``verify_instance`` (one thread, CPU clock; the attack-first step included) with
``bab.Search``'s methods wrapped to print, without changing what they compute: the root's
bound per open row after its ``root_steps`` (``Search._root``) and the unstable ReLUs per
layer on the root's boxes; then every ``--every`` rounds the domains bounded so far and per
CPU second of search, the open domains, their lowest and highest bound, the round's CPU
seconds and the process's peak resident memory; at the end the verdict, the domains
bounded in all and per CPU second. This is what alpha-beta-CROWN's log prints for the same
instance (its root bound, "domains visited"), for the comparisons in
docs/certification.md. ``--suite cifar --net resnet_2b --prop prop_0_ --timeout 300
--verifier complete`` is the CIFAR run there. Work is bounded by CPU time, so the numbers
depend on the load (printed with the CPU model).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from abcrown.run import instances, select  # noqa: E402
from bab_speed import cpu_model  # noqa: E402
from verification import parse_verifier  # noqa: E402


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def trace(bab, every: int) -> dict:
    """Wrap ``bab.Search``'s root and round methods to print; returns the running totals."""
    totals = {"domains": 0, "search_cpu": 0.0, "began": None}
    search_cls = bab.Search
    root, bound_and_prune = search_cls._root, search_cls._bound_and_prune

    def traced_root(self, spec, offset):
        cpu = time.process_time()
        bound, slopes = root(self, spec, offset)
        print(f"root: {len(offset)} open rows after alpha-CROWN; after {self.config.root_steps} "
              f"root steps: lowest {float(bound.min()):.4f}, rows <= 0: "
              f"{int((bound <= 0).sum())}; {time.process_time() - cpu:.1f} CPU s; peak "
              f"{peak_gib():.2f} GiB", flush=True)  # fmt: skip
        unstable = []
        for i in bab.relu_nodes(self.graph):
            lo, hi = self.root[self.graph.ops[i].inputs[0]]
            unstable.append(int(((lo < 0) & (hi > 0)).sum()))
        print(f"unstable ReLUs per layer on the root's boxes: {unstable} ({sum(unstable)})")
        totals["began"] = time.process_time()
        return bound, slopes

    def traced_round(self, todo):
        cpu = time.process_time()
        point = bound_and_prune(self, todo)
        totals["domains"] += len(todo)
        totals["search_cpu"] = time.process_time() - totals["began"]
        if self.rounds % every == 0:
            d = self.open
            n_open = len(d) if d is not None else 0
            low, high = (float(d.bound.min()), float(d.bound.max())) if n_open else (0.0, 0.0)
            rate = totals["domains"] / max(totals["search_cpu"], 1e-9)
            print(f"round {self.rounds:>4}: {len(todo):>4} domains in "
                  f"{time.process_time() - cpu:6.2f} CPU s; bounded {totals['domains']} "
                  f"({rate:.0f}/s); open {n_open:>6}, lowest {low:.4f}, highest {high:.4f}; "
                  f"peak {peak_gib():.2f} GiB", flush=True)  # fmt: skip
        return point

    search_cls._root, search_cls._bound_and_prune = traced_root, traced_round
    return totals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default="mnistfc", help="mnistfc, eran or cifar")
    parser.add_argument("--net", default="256x4")
    parser.add_argument("--prop", default="prop_5_0.03")
    parser.add_argument("--timeout", type=float, default=60.0, help="CPU seconds")
    parser.add_argument("--verifier", default="bab", help="name[:key=value,...]")
    parser.add_argument("--every", type=int, default=10, help="print every this many rounds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from aisafety.plugins import default_registry
    from aisafety.verification import bab
    from aisafety.verification.vnncomp import verify_instance

    ((net, onnx_path, spec),) = select(instances(args.suite), [args.net], 1, [args.prop])
    totals = trace(bab, max(1, args.every))
    verifier, config = parse_verifier(args.verifier)
    print(f"{net} {spec.name}, {args.verifier}, {args.timeout:g} CPU s, one thread; CPU "
          f"{cpu_model()}; load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    cpu = time.process_time()
    result = verify_instance(default_registry(), onnx_path, spec, verifier, args.timeout,
                             {"clock": "cpu", **config})  # fmt: skip
    cpu = time.process_time() - cpu
    rate = totals["domains"] / totals["search_cpu"] if totals["search_cpu"] else 0.0
    print(f"{result.status} ({result.how}), margin {result.margin:.4f}; {cpu:.1f} CPU s; "
          f"{totals['domains']} domains in {totals['search_cpu']:.1f} CPU s of search "
          f"({rate:.1f}/s); peak {peak_gib():.2f} GiB; load {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
