"""The quick start as a new user runs it: `aisafety evaluate` (the default plan) on one
thread, then `aisafety report`, each one's CPU and wall time printed beside README.md's
claim, and the default's promise checked on the stored run: its ensemble at least as strong
as every single attack beside it at every budget, and every sanity check run.

    python bench/first_run.py

Run it on an idle machine for the wall times; CPU time (user + system of the command and
its children) is the number that a busy machine changes least. The README's claim is read
from its line ``first run, measured by bench/first_run.py: evaluate N s of CPU ...``.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
AISAFETY = shutil.which("aisafety") or "aisafety"
CLAIM = re.compile(
    r"first run, measured by bench/first_run\.py: evaluate (?P<evaluate>[\d.]+) s of CPU "
    r"\((?P<evaluate_wall>[\d.]+) s wall\), report (?P<report>[\d.]+) s of CPU "
    r"\((?P<report_wall>[\d.]+) s wall\)"
)


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the command and its children, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True,
                          text=True)  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def claim() -> dict[str, float]:
    text = " ".join(README.read_text().split())
    found = CLAIM.search(text)
    if found is None:
        sys.exit(f"README.md has no line matching {CLAIM.pattern!r}")
    return {k: float(v) for k, v in found.groupdict().items()}


def ensemble_never_weaker(db: Path) -> list[str]:
    """Budgets where a single attack leaves fewer images robust than the default's
    ensemble (robust accuracy from each unit's stored outcome)."""
    from aisafety.store.results import ResultStore

    store = ResultStore(f"sqlite:///{db}")
    _, rows = store.query(
        "SELECT attack, eps, robust_accuracy FROM attack_runs WHERE family != 'corruption'"
    )
    by_eps: dict[float, dict[str, float]] = defaultdict(dict)
    for attack, eps, robust in rows:
        by_eps[eps][attack] = robust
    problems = []
    for eps, attacks in sorted(by_eps.items()):
        ensemble = [v for a, v in attacks.items() if a.startswith("standard")]
        for attack, robust in attacks.items():
            if ensemble and robust < ensemble[0]:
                problems.append(f"eps {eps:g}: {attack} {robust:.3f} < ensemble {ensemble[0]:.3f}")
        line = ", ".join(f"{a.split('(')[0]}{'' if '(' not in a else '(..)'} {v:.3f}"
                         for a, v in attacks.items())  # fmt: skip
        print(f"  eps {eps:g}: {line}")
    return problems


def main() -> None:
    promised = claim()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="aisafety-first-run-") as folder:
        cwd = Path(folder)
        evaluate = timed([AISAFETY, "evaluate"], cwd, env)
        report = timed([AISAFETY, "report", "-o", "report.html"], cwd, env)
        print(f"{'command':20} {'CPU s':>7} {'README':>7} {'wall s':>7} {'README':>7}")
        for name, (wall, cpu, _), key in (("aisafety evaluate", evaluate, "evaluate"),
                                       ("aisafety report", report, "report")):  # fmt: skip
            print(f"{name:20} {cpu:7.1f} {promised[key]:7.1f} {wall:7.1f} "
                  f"{promised[key + '_wall']:7.1f}")  # fmt: skip
        print(f"load average now: {os.getloadavg()[0]:.1f} (wall times mean little above ~1)")
        print("robust accuracy per budget:")
        problems = ensemble_never_weaker(cwd / "aisafety.db")
        print(evaluate[2][evaluate[2].find("sanity checks") :].rstrip())
    print("ensemble never weaker: " + ("yes" if not problems else "NO: " + "; ".join(problems)))
    if evaluate[1] > 120:
        print(f"over the 2-minute CPU budget: {evaluate[1]:.0f} s")


if __name__ == "__main__":
    main()
