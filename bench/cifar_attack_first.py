"""Attack first only, on every CIFAR instance: what our falsify step alone settles, in CPU s.

    python bench/cifar_attack_first.py [--nets resnet cifar10_] [--out rows.jsonl]
                                       [--check bench/results/*.jsonl ...]

For each of the 144 instances of ``../shared/data/cifar10-models`` (the VNN-COMP 2021
ResNets and Marabou nets, ``bench/abcrown/run.py``'s listing) the step ``complete`` (and
``bab``) runs before any bound, with their default settings, and nothing else: box-PGD
with restarts from the box's centre and corners (``Verifier.attack``) on instances whose
disjuncts are single rows (the ResNets), or ``vnncomp.all_rows_hold`` on each disjunct of
a conjunction (Marabou's targeted properties). A point counts only after replay through
onnxruntime on the file as shipped. Printed per instance: sat or not, the process CPU
seconds of the step (the network's loading excluded: it is counted once per net, apart);
per net: how many are sat and how many within 5 s. ``--check``: result files of other
verifiers (ours, alpha-beta-CROWN's rows): any instance called ``unsat`` there that the
attack breaks is printed as a contradiction.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from abcrown.run import instances, select  # noqa: E402


def attack_only(onnx_path: Path, spec: Path) -> bool:
    """True when the falsify step alone finds a point violating the property (replayed)."""
    from aisafety.plugins import default_registry
    from aisafety.verification.registry import make_verifier
    from aisafety.verification.vnncomp import all_rows_hold, load_network, rows_property
    from aisafety.verification.vnnlib import read_disjuncts

    net = load_network(str(onnx_path))
    box, disjuncts = read_disjuncts(spec, math.prod(net.shape), net.reference.num_classes)
    lower, upper = (b.reshape(1, *net.shape) for b in box)
    if all(len(rows) == 1 for rows in disjuncts):
        prop = rows_property(lower, upper, [r[0] for r in disjuncts]).to(net.graph.dtype)
        verifier = make_verifier(default_registry(), "complete")
        broken, _ = verifier.attack(net.graph, prop, net.run)
        return bool(broken[0])
    return any(all_rows_hold(net, rows_property(lower, upper, rows)) is not None
               for rows in disjuncts)  # fmt: skip


def unsat_elsewhere(files: list[str]) -> dict[tuple[str, str], list[str]]:
    """(net, property) -> the tools that answered ``unsat`` in ``files``."""
    found: dict[tuple[str, str], list[str]] = {}
    for name in files:
        for line in Path(name).read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("status") == "unsat":
                key = (row["net"], Path(row["property"]).name)
                found.setdefault(key, []).append(f"{row['tool']} ({Path(name).name})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nets", nargs="*", default=["resnet", "cifar10_"])
    parser.add_argument("--out", default="")
    parser.add_argument("--check", nargs="*", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    from aisafety.verification.vnncomp import load_network

    rows = select(instances("cifar"), args.nets, 0, [])
    unsat = unsat_elsewhere(args.check)
    print(f"{len(rows)} instances, 1 thread; load average at start {os.getloadavg()[0]:.1f}")
    counts: dict[str, list[int]] = {}
    contradictions = 0
    for net, onnx_path, spec in rows:
        if net not in counts:
            cpu = time.process_time()
            load_network(str(onnx_path))
            print(f"{net}: loaded in {time.process_time() - cpu:.1f} CPU s")
            counts[net] = [0, 0, 0]
        cpu, wall = time.process_time(), time.perf_counter()
        sat = attack_only(onnx_path, spec)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        counts[net][0] += sat
        counts[net][1] += sat and cpu <= 5
        counts[net][2] += 1
        key = (net, Path(spec).name)
        clash = sat and key in unsat
        contradictions += clash
        note = f"  CONTRADICTS unsat of {', '.join(unsat[key])}" if clash else ""
        print(f"{net:<15} {Path(spec).name:<62} {'sat' if sat else '-':>4} {cpu:6.2f} cpu s"
              f"{note}", flush=True)  # fmt: skip
        if args.out:
            row = {"suite": "cifar", "net": net, "property": Path(spec).name,
                   "tool": "attack-first", "status": "sat" if sat else "not broken",
                   "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}  # fmt: skip
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    for net, (sat, fast, n) in counts.items():
        print(f"{net:<15} sat {sat}/{n}; within 5 CPU s {fast}/{n}")
    print(f"contradictions with unsat elsewhere: {contradictions}; load average at end "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
