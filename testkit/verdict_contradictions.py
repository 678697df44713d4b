"""Whether the verdicts of several verifiers on the same instances contradict each other: an
``unsat`` of one tool beside a ``sat`` of another. Read by bench/sweep_report.py (a sweep's
rows) and tests/test_sweep_verdicts.py (hand-made rows, the kept sweep, a live run)."""

from __future__ import annotations


def contradictions(rows: list[dict]) -> tuple[list[str], list[str]]:
    """Instances where one tool's unsat meets another's (replayed) sat; and the sats whose
    counterexample did not replay (``cex_replays: false``: they refute nothing)."""
    verdicts: dict[tuple[str, str], dict[str, set]] = {}
    unreplayed = []
    for row in rows:
        status = row["status"]
        if status == "sat" and row.get("cex_replays") is False:
            unreplayed.append(f"{row['net']} {row['property']} ({row['tool']})")
            continue
        if status in ("sat", "unsat"):
            key = (row["net"], row["property"])
            verdicts.setdefault(key, {}).setdefault(status, set()).add(row["tool"])
    found = [f"{net} {prop}: unsat by {sorted(v['unsat'])}, sat by {sorted(v['sat'])}"
             for (net, prop), v in sorted(verdicts.items()) if len(v) == 2]  # fmt: skip
    return found, unreplayed
