"""Differential fuzzing of every registered verifier (testkit/verifier_fuzz.py).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python3 bench/verifier_fuzz.py FIRST LAST \
        [--skip NAME,...] [--only NAME,...] [--out FILE.jsonl]

Seeds FIRST..LAST-1: per seed a random network and property (docs/certification.md,
"Differential fuzzing"), every verifier that takes the graph checked against the reference
values. Prints each finding as it comes and, at the end, the cases, the shapes drawn, per
verifier the cases it ran and its findings by kind, and the errors raised (a crash is not
unsound, but is listed). Exits 1 if any invariant broke.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

from aisafety.plugins import default_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from verifier_fuzz import check_verifier, random_case, reference  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("--skip", default="", help="verifiers left out, comma-separated")
    parser.add_argument("--only", default="", help="only these verifiers, comma-separated")
    parser.add_argument("--out", type=Path, help="one JSON line per (seed, verifier)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    registry = default_registry()
    names = [n for n in registry.names("verifier") if n not in args.skip.split(",")]
    names = [n for n in names if not args.only or n in args.only.split(",")]
    ran, found, errors = collections.Counter(), collections.Counter(), collections.Counter()
    shapes, milp = collections.Counter(), 0
    verdicts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    out = args.out.open("a") if args.out else None
    for seed in range(args.first, args.last):
        case = random_case(seed)
        ref = reference(case)
        milp += int(ref.milp.any())
        shapes.update(w for w in case.what.split() if "=" not in w)
        print(f"seed {seed}: {case.what}{' (MILP)' if ref.milp.any() else ''}", flush=True)
        for name in names:
            began = time.process_time()
            try:
                counted = collections.Counter()
                findings = check_verifier(registry, name, case, ref, counted)
            except Exception as exc:  # noqa: BLE001 - listed, the fuzzing goes on
                errors[(name, type(exc).__name__)] += 1
                print(f"  ERROR {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            if findings is None:
                continue
            ran[name] += 1
            verdicts[name].update(counted)
            for finding in findings:
                found[(name, finding.kind)] += 1
                print(f"  {finding}", flush=True)
            if out:
                record = {"seed": seed, "verifier": name, "case": case.what,
                          "cpu_s": time.process_time() - began, "verdicts": dict(counted),
                          "findings": [f"{f.kind}: {f.detail}" for f in findings]}  # fmt: skip
                out.write(json.dumps(record) + "\n")
    print(f"\n{args.last - args.first} cases ({milp} with a MILP reference)")
    print("drawn:", ", ".join(f"{k} {v}" for k, v in sorted(shapes.items())))
    for name in names:
        kinds = {k: v for (n, k), v in found.items() if n == name}
        counts = ", ".join(f"{v} {n}" for v, n in sorted(verdicts[name].items()))
        print(f"{name}: ran {ran[name]} ({counts}), findings {kinds or 'none'}")
    for (name, kind), count in sorted(errors.items()):
        print(f"error {name}: {kind} x{count}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
