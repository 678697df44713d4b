"""Differential fuzzing of the VNN-COMP route (testkit/vnncomp_fuzz.py).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python3 bench/vnncomp_fuzz.py FIRST LAST \
        [--family targeted|rows|mixed] [--only NAME,...] [--timeout S] [--ticks] [--tiny] \
        [--out FILE.jsonl]

Seeds FIRST..LAST-1: per seed a random network and VNN-LIB-like disjunction of
conjunctions, run through ``vnncomp.verify_disjuncts`` by alpha-crown, bab and complete
(timeout S CPU seconds, default 3), each answer checked against the reference values (the
MILP's exact minimiser on small ReLU nets). ``--ticks``: the anytime family, each run under
a counting clock with a limit of 1-80,000 readings drawn per seed and verifier (the deadline
expires at a random point of the route); ``--tiny``: real CPU limits of 1 ms to 0.3 s.
Prints each finding, then per family and verifier the statuses and findings, and per
verifier the statuses on violated cases (a reference point with v <= 0), those whose box
holds no float32 point (never ``sat``: nothing replays) apart from the others (where
anything but ``sat`` is a miss, if not an unsound answer). Exits 1 if any invariant broke.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

from aisafety.plugins import default_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from vnncomp_fuzz import (  # noqa: E402
    VERIFIERS,
    check,
    random_case,
    reference,
    run_case,
    tick_limit,
    ticking_clock,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("--family", default=None)
    parser.add_argument("--only", default="", help="only these verifiers, comma-separated")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--ticks", action="store_true", help="counting clock, random limits")
    parser.add_argument("--tiny", action="store_true", help="CPU limits of 1 ms to 0.3 s")
    parser.add_argument("--out", type=Path, help="one JSON line per (seed, verifier)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    registry = default_registry()
    names = [n for n in VERIFIERS if not args.only or n in args.only.split(",")]
    statuses: dict[tuple[str, str], collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    violated: dict[tuple[str, str], collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    found, errors, cases, milp = (
        collections.Counter(),
        collections.Counter(),
        collections.Counter(),
        0,
    )
    out = args.out.open("a") if args.out else None
    for seed in range(args.first, args.last):
        case = random_case(seed, args.family)
        ref = reference(case)
        cases[case.family] += 1
        milp += ref.milp
        print(f"seed {seed}: {case.what} lowest {ref.lowest:.4g}{' (MILP)' if ref.milp else ''}",
              flush=True)  # fmt: skip
        for name in names:
            limit = float(tick_limit(seed, name)) if args.ticks else args.timeout
            if args.tiny:
                limit = 10 ** (-3 + 2.5 * torch.rand((), generator=torch.Generator().manual_seed(
                    seed * 7 + len(name))).item())  # fmt: skip
            began = time.process_time()
            clock = ticking_clock() if args.ticks else contextlib.nullcontext()
            try:
                with clock:
                    result = run_case(registry, name, case, limit)
            except Exception as exc:  # noqa: BLE001 - listed, the fuzzing goes on
                errors[(name, type(exc).__name__)] += 1
                print(f"  ERROR {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            if result is None:
                continue
            findings = check(case, ref, result, name)
            statuses[(case.family, name)][result.status] += 1
            if ref.violated:
                point = "with a float32 point" if ref.float32_point else "no float32 point"
                violated[(name, point)][result.status] += 1
            print(f"  {name} (limit {limit:.4g}): {result.status} {result.margin:.5g}", flush=True)
            for finding in findings:
                found[(name, finding.kind)] += 1
                print(f"  {finding}", flush=True)
            if out:
                record = {"seed": seed, "verifier": name, "case": case.what, "limit": limit,
                          "status": result.status, "margin": result.margin,
                          "lowest": ref.lowest, "float32_point": ref.float32_point,
                          "cpu_s": time.process_time() - began,
                          "findings": [f"{f.kind}: {f.detail}" for f in findings]}  # fmt: skip
                out.write(json.dumps(record) + "\n")
                out.flush()
    print(f"\n{args.last - args.first} cases ({milp} with a MILP reference): "
          + ", ".join(f"{k} {v}" for k, v in sorted(cases.items())))  # fmt: skip
    for (family, name), counted in sorted(statuses.items()):
        print(f"{family} {name}: " + ", ".join(f"{v} {s}" for s, v in sorted(counted.items())))
    for (name, point), counted in sorted(violated.items()):
        print(f"violated, {point}, {name}: "
              + ", ".join(f"{v} {s}" for s, v in sorted(counted.items())))  # fmt: skip
    for name in names:
        kinds = {k: v for (n, k), v in found.items() if n == name}
        print(f"{name}: findings {kinds or 'none'}")
    for (name, kind), count in sorted(errors.items()):
        print(f"error {name}: {kind} x{count}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
