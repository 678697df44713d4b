"""What ``bab`` does on one VNN-COMP instance: its root bounds, domains per CPU second, memory.

    python bench/bab_trace_vnncomp.py [--suite cifar] [--net resnet_2b] [--prop prop_0_]
                              [--timeout 300] [--verifier complete:bab_steps=10]

Runs ``verify_instance`` (one thread, CPU clock) with the search's methods wrapped to print,
without changing what they compute: the root's bound per open row before and after its
``root_steps`` (``Search._root``), then per round the domains bounded, the lowest open
bound, the open domains, the CPU seconds of the round and the process's peak resident
memory. The end: status, domains bounded in all, domains per CPU second of the search.
This is what alpha-beta-CROWN's log prints for the same instance (its root bound, "domains
visited"), for the comparison in docs/certification.md.
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
from verification import parse_verifier  # noqa: E402


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def trace(bab) -> dict:
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
        lowest = float(self.open.bound.min()) if self.open is not None and len(self.open) else 0
        n_open = len(self.open) if self.open is not None else 0
        print(f"round {self.rounds:>4}: {len(todo):>4} domains in {time.process_time() - cpu:6.2f}"
              f" CPU s; open {n_open:>6}, lowest {lowest:.4f}; total {totals['domains']}; "
              f"peak {peak_gib():.2f} GiB", flush=True)  # fmt: skip
        return point

    search_cls._root, search_cls._bound_and_prune = traced_root, traced_round
    return totals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default="cifar")
    parser.add_argument("--net", default="resnet_2b")
    parser.add_argument("--prop", default="prop_0_")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--verifier", default="complete")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from aisafety.plugins import default_registry
    from aisafety.verification import bab
    from aisafety.verification.vnncomp import verify_instance

    ((net, onnx_path, spec),) = select(instances(args.suite), [args.net], 1, [args.prop])
    totals = trace(bab)
    verifier, config = parse_verifier(args.verifier)
    print(f"{net} {spec.name}, {args.verifier}, {args.timeout:g} CPU s; load "
          f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
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
