"""The comparison page's leaderboard: equal mean ranks share the better rank, as its caption
says, and the runs column says what its ids are."""

from __future__ import annotations

from datetime import datetime

from aisafety.report.data import MetricRow, RunData
from aisafety.report_catalog import default_catalog
from aisafety.report_page import build_comparison, leaderboard, shared_ranks

DATASET = {"name": "mnist", "split": "test", "n_samples": 10, "fingerprint": "f" * 64}


def _run(run_id: int, model: str, values: tuple[float, float], seed: int = 0) -> RunData:
    rows = [
        MetricRow(model, "mnist", metric, None, None, value, "higher", "fraction", 10, {})
        for metric, value in zip(("ca", "acac"), values, strict=True)
    ]
    return RunData(
        run_id, "finished", datetime(2026, 11, 28), None, "0", seed, "cpu", {}, None,
        [{"name": model}], [DATASET], rows, [],
    )  # fmt: skip


def test_shared_ranks_by_hand():
    assert shared_ranks([1.0, 2.5, 2.5, 4.0]) == [1, 2, 2, 4]
    assert shared_ranks([2.0, 2.0, 2.0]) == [1, 1, 1]
    assert shared_ranks([3.0, float("inf"), 1.0]) == [2, None, 1]


def test_tied_mean_ranks_share_the_better_rank():
    """b ranks (2, 3) and c (3, 2): both mean 2.50, shown as ranks 2 and 3 before."""
    runs = [_run(7, "a", (0.9, 0.9)), _run(8, "b", (0.8, 0.7)), _run(9, "c", (0.7, 0.8), 3)]
    (family,) = leaderboard(runs, default_catalog())
    got = [(r["model"], r["rank"], r["mean_rank"], r["runs"]) for r in family["rows"]]
    assert got == [("a", 1, 1.0, "7 (seed 0)"), ("b", 2, 2.5, "8 (seed 0)"),
                   ("c", 2, 2.5, "9 (seed 3)")]  # fmt: skip


def test_the_page_shows_the_shared_rank_and_explains_the_runs(monkeypatch):
    runs = {7: _run(7, "a", (0.9, 0.9)), 8: _run(8, "b", (0.8, 0.7)), 9: _run(9, "c", (0.7, 0.8))}
    monkeypatch.setattr("aisafety.report_page.load_run", lambda store, run_id: runs[run_id])
    monkeypatch.setattr("aisafety.report_page.sanity_checks", lambda data, defaults: [])
    html = build_comparison(None, [7, 8, 9])
    table = html[html.index('id="leaderboard"') :]
    assert [table.count(f'<td class="num">{rank}</td>') for rank in (1, 2, 3)] == [1, 2, 0]
    assert "aisafety report ID" in table and "id (seed)" in table
