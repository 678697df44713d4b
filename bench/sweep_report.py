"""A verification sweep's JSON lines: settled per net and tool, and no verdict contradicted.

    python bench/sweep_report.py RESULTS.jsonl ... [--cpu-limit 60] [--attack]

Reads the rows ``bench/verification.py --out`` (ours) and ``bench/abcrown/run.py --out``
(alpha-beta-CROWN) write, one per instance and tool. Prints per net and tool: instances,
sat, unsat, settled within ``--cpu-limit`` seconds of CPU, and the median and largest CPU
seconds of the settled ones. Then the contradiction check, per instance: an ``unsat`` of
any tool beside a ``sat`` of another (alpha-beta-CROWN's counts only when its
counterexample replayed under onnxruntime; one that did not is listed apart). With
``--attack`` every instance some tool answered ``unsat`` is also attacked by our box-PGD
(200 steps, 5 restarts, replayed through onnxruntime; ``bench/verify_cifar10.py``), which
counts as one more tool's ``sat``. Exits 1 on any contradiction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from verdict_contradictions import contradictions  # noqa: E402


def read_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    return rows


def settled_table(rows: list[dict], cpu_limit: float) -> list[str]:
    """One line per (net, tool): counts and CPU seconds of what was settled."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["net"], row["tool"]), []).append(row)
    within = f"settled<={cpu_limit:g}s"
    lines = [f"{'net':<30} {'tool':<13} {'n':>3} {'sat':>4} {'unsat':>5} {within:>12} "
             f"{'median':>7} {'max':>6}"]  # fmt: skip
    for (net, tool), group in sorted(groups.items()):
        done = [r for r in group if r["status"] in ("sat", "unsat") and r["cpu_s"] <= cpu_limit]
        cpu = [r["cpu_s"] for r in done] or [float("nan")]
        sat = sum(r["status"] == "sat" for r in group)
        unsat = sum(r["status"] == "unsat" for r in group)
        median = statistics.median(cpu)
        lines.append(f"{net:<30} {tool:<13} {len(group):>3} {sat:>4} {unsat:>5} "
                     f"{len(done):>12} {median:>7.1f} {max(cpu):>6.1f}")  # fmt: skip
    return lines


def attack_unsat(rows: list[dict]) -> list[dict]:
    """Our box-PGD on every instance some tool answered unsat, as rows of tool ``box-pgd``."""
    from abcrown.run import instances
    from verify_cifar10 import broken_by_pgd

    paths = {(net, spec.name): (onnx_path, spec) for suite in ("mnistfc", "eran", "cifar")
             for net, onnx_path, spec in instances(suite)}  # fmt: skip
    keys = sorted({(r["net"], r["property"]) for r in rows if r["status"] == "unsat"})
    found = []
    for net, prop in keys:
        broken = broken_by_pgd(*paths[(net, prop)])
        found.append({"net": net, "property": prop, "tool": "box-pgd", "cpu_s": 0.0,
                      "status": "sat" if broken else "unknown"})  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="+")
    parser.add_argument("--cpu-limit", type=float, default=60.0)
    parser.add_argument("--attack", action="store_true", help="box-PGD on every unsat")
    args = parser.parse_args()
    rows = read_rows(args.results)
    print("\n".join(settled_table(rows, args.cpu_limit)))
    if args.attack:
        attacked = attack_unsat(rows)
        print(f"box-PGD on the {len(attacked)} instances answered unsat: broke "
              f"{sum(r['status'] == 'sat' for r in attacked)}")  # fmt: skip
        rows += attacked
    found, unreplayed = contradictions(rows)
    instances_seen = len({(r["net"], r["property"]) for r in rows})
    print(f"contradictions on {instances_seen} instances: {len(found)}")
    print("\n".join(found))
    if unreplayed:
        print("sat whose counterexample did not replay (not counted):", *unreplayed, sep="\n  ")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
