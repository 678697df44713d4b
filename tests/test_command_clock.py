"""The command's wall time (issue #36): the report gives the time a user waited for the
``aisafety`` command, imports and loading included, beside the evaluation's own."""

from __future__ import annotations

import subprocess
import sys

from aisafety.cli import main
from aisafety.command_clock import command_started_at
from aisafety.report.data import load_run
from aisafety.report_page import build_report
from aisafety.store.results import ResultStore

PLAN = (
    "dataset: {name: mnist-embedded, limit: 8}\n"
    "attacks: [{name: fgsm, eps: [0.1]}]\n"
    "metrics: [ca, robust-accuracy]\n"
)


def test_the_process_start_is_read_from_the_kernel():
    """A child that sleeps before asking is at least that old: the start is its process's,
    not the moment of the call (a lower bound only: a busy machine makes it older)."""
    code = (
        "import time; time.sleep(0.3); "  # 0.3 s: 30 of /proc's ticks (1 s before)
        "from aisafety.command_clock import process_start_time as p; "
        "print(time.time() - p())"
    )
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                               text=True, check=True).stdout)  # fmt: skip
    assert age >= 0.3 - 0.02  # /proc's clocks tick in hundredths of a second


def test_a_command_stores_its_start_and_the_report_shows_the_wait(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet"]) == 0
    assert command_started_at() is None  # marked only while the command runs
    data = load_run(ResultStore(db), 1)
    assert data.command_started_at is not None
    assert data.command_started_at <= data.started_at  # loading came before the run row
    assert data.command_seconds >= data.wall_seconds > 0
    html = build_report(ResultStore(db), 1)
    assert f"wall time of the command</th><td>{data.command_seconds:.1f} s" in html


def test_a_run_made_from_python_has_no_command(report_db):
    url, run_id = report_db
    data = load_run(ResultStore(url), run_id)
    assert data.command_started_at is None and data.command_seconds is None
    html = build_report(ResultStore(url), run_id)
    assert "wall time of the command</th><td>not recorded" in html
