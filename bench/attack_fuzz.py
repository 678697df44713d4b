"""Soundness fuzzing of every registered attack, and of certificates against attacks
(testkit/attack_fuzz.py).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python3 bench/attack_fuzz.py FIRST LAST \
        [--skip NAME,...] [--no-verifiers] [--float32 exact|rigorous] [--out FILE.jsonl]

Seeds FIRST..LAST-1: per seed a random float32 network (a third behind a deterministic input
defense), 4-7 images and an l-inf budget; every attack's returned points checked (docs/attacks.md,
"Fuzzing the attacks"), and on undefended cases every verifier's certificates at the budget
checked against every attack's replayed breaks. Prints each finding as it comes and, at the
end, the cases, attack runs, broken and certified counts, the largest float64 excess of a
returned point over its budget per norm, the findings by kind and the errors raised (a crash
is not unsound, but is listed). Exits 1 if an invariant broke beyond the kinds ``--allow``
names (default: the float32 ties, testkit/attack_fuzz.py's ``ROUNDING``). ``--float32
rigorous`` runs the verifiers with that setting (docs/certification.md): their certificates
are then of the float32 network, so one contradicted in float32 only is a plain finding.
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
from attack_fuzz import ROUNDING, fuzz_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("--skip", default="", help="attacks and verifiers left out")
    parser.add_argument("--no-verifiers", action="store_true", help="attack checks only")
    parser.add_argument("--allow", default=",".join(ROUNDING), help="finding kinds not failing")
    parser.add_argument("--float32", choices=["exact", "rigorous"], default="exact",
                        help="the verifiers' float32 setting")  # fmt: skip
    parser.add_argument("--out", type=Path, help="one JSON line per case")
    args = parser.parse_args()
    torch.set_num_threads(1)
    registry = default_registry()
    skip = set(args.skip.split(","))
    attacks = [n for n in registry.names("attack") if n not in skip]
    verifiers = [] if args.no_verifiers else registry.names("verifier")
    verifiers = [n for n in verifiers if n not in skip]
    found, errors = collections.Counter(), collections.Counter()
    totals, certified, excess = collections.Counter(), collections.Counter(), {}
    out = args.out.open("a") if args.out else None

    def error(name: str, exc: Exception) -> None:
        errors[(name, type(exc).__name__)] += 1
        print(f"  ERROR {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)

    for seed in range(args.first, args.last):
        began = time.process_time()
        case, findings, ran = fuzz_case(
            registry, seed, attacks, verifiers, errors=error, float32=args.float32
        )
        totals.update(cases=1, defended=int(case.defended), attacks=ran["attacks"],
                      broken=ran["broken"], pairs=ran["pairs"],
                      certified=sum(ran["certified"].values()))  # fmt: skip
        certified.update(ran["certified"])
        for norm, value in ran["excess"].items():
            excess[norm] = max(excess.get(norm, 0.0), value)
        print(f"seed {seed}: {case.what} eps {case.eps:g}: {ran['attacks']} attack runs, "
              f"{len(findings)} findings", flush=True)  # fmt: skip
        for finding in findings:
            found[finding.kind] += 1
            print(f"  {finding}", flush=True)
        if out:
            record = {"seed": seed, "case": case.what, "eps": case.eps, **ran,
                      "cpu_s": time.process_time() - began,
                      "findings": [str(f) for f in findings]}  # fmt: skip
            out.write(json.dumps(record) + "\n")
            out.flush()
    print(f"\n{totals['cases']} cases ({totals['defended']} defended), "
          f"{totals['attacks']} attack runs, {totals['broken']} broken samples, "
          f"{totals['certified']} certificates, {totals['pairs']} (certificate, attack) "
          "pairs checked")  # fmt: skip
    print("certified per verifier:", ", ".join(f"{k} {v}" for k, v in sorted(certified.items())))
    print("largest excess over eps:", ", ".join(f"{k} {v:.3g}" for k, v in excess.items()))
    print("findings:", ", ".join(f"{k} {v}" for k, v in sorted(found.items())) or "none")
    for (name, kind), count in sorted(errors.items()):
        print(f"error {name}: {kind} x{count}")
    allowed = set(args.allow.split(","))
    return 1 if any(kind not in allowed for kind in found) else 0


if __name__ == "__main__":
    sys.exit(main())
