"""examples/full.yaml: every metric it names produces stored rows, through the command line.

Run on a 20-image subset (``--limit``) so it stays quick; the full-size run is timed by hand
(docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path

import yaml

from aisafety.cli import main
from aisafety.config import load_plan
from aisafety.store.results import ResultStore

FULL = Path(__file__).parent.parent / "examples" / "full.yaml"


def test_full_example_stores_a_value_for_every_metric(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'full.db'}"
    assert main(["evaluate", str(FULL), "--db", db, "--limit", "20", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "robust accuracy against budget" in printed

    plan = load_plan(FULL)
    asked = {m.name for m in plan.metrics}
    _, rows = ResultStore(db).query("SELECT metric, value FROM results")
    stored = {}
    for metric, value in rows:
        stored.setdefault(metric.split("(")[0], []).append(value)
    assert asked <= set(stored), f"no rows for {sorted(asked - set(stored))}"
    # every metric has at least one number (NaN, stored as NULL, only where a subset is empty)
    assert [m for m in asked if all(v is None for v in stored[m])] == []
    assert len(yaml.safe_load(FULL.read_text())["metrics"]) == len(plan.metrics)
