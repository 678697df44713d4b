"""SIGTERM before the first unit ends a run as Ctrl-C does: exit 130 and 'interrupted', not
143 or 'failed'; a run whose process vanishes (os._exit in a plugin) is marked by the next
run (issue #35, finding 7)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import children
import pytest

from aisafety.interfaces import EvaluationPlan
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

REPO = str(Path(__file__).resolve().parents[1])
CHILD = """
import sys
from aisafety.cli import main
print("ready", flush=True)
sys.exit(main(sys.argv[1:]))
"""
SLOW_PLAN = """
dataset: {limit: 100}
attacks: [{name: pgd-linf, config: {steps: 5000}, eps: [0.3]}]
metrics: [robust-accuracy]
device: cpu
"""


def _start(tmp_path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert child.stdout.readline().strip() == "ready"
    return child


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (/proc's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def _runs(path) -> list[tuple]:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as connection:
            return connection.execute(
                "SELECT status, (SELECT COUNT(*) FROM units) FROM runs"
            ).fetchall()
    except sqlite3.Error:
        return []


@pytest.mark.parametrize("moment", ["while loading", "run started, no unit finished"])
def test_sigterm_before_the_first_unit_is_an_interruption(tmp_path, moment):
    plan, db = tmp_path / "plan.yaml", tmp_path / "r.db"
    plan.write_text(SLOW_PLAN)
    child = _start(tmp_path, "evaluate", str(plan), "--db", f"sqlite:///{db}", "--quiet")
    if moment == "while loading":
        # the command's handler is in place (a fixed 0.5 s was a guess a loaded machine could
        # beat: SIGTERM before it kills with 143); the plan, plugins and model still load
        deadline = time.monotonic() + children.HANG_LIMIT  # a hang guard, not a time limit
        while not _catches(child.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        deadline = time.monotonic() + children.HANG_LIMIT  # a hang guard, not a time limit
        while not _runs(db) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _runs(db) == [("running", 0)]
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=children.HANG_LIMIT)
    assert child.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    if moment != "while loading":
        assert _runs(db) == [("interrupted", 0)]


VANISHING = """
import os, sys, types
from aisafety.attack.fgsm import FGSM
from aisafety.store.results import ResultStore
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import EvaluationPlan
from aisafety.plugins import build_registry
from aisafety.runner import Runner

class Vanishing(FGSM):
    name = "vanishing"
    def perturb(self, *args, **kwargs):
        os._exit(0)

module = types.ModuleType("vanishing")
module.aisafety_attacks = hookimpl(lambda: [Vanishing])
plan = EvaluationPlan.model_validate_json(sys.argv[2])
Runner(plan, ResultStore(sys.argv[1]), registry=build_registry([("vanishing", module)]),
       quiet=True).run()
"""


def test_a_run_whose_process_vanishes_is_marked_by_the_next_run(tmp_path):
    """os._exit cannot be caught (exit 0, no handler runs); the next run on this host finds
    the process gone and marks the run 'interrupted' (store/liveness.py)."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    plan = EvaluationPlan.model_validate(
        {"dataset": {"limit": 8}, "attacks": [{"name": "vanishing", "eps": [0.1]}],
         "metrics": ["robust-accuracy"], "device": "cpu"}
    )  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    command = [sys.executable, "-c", textwrap.dedent(VANISHING), url, plan.model_dump_json()]
    done = subprocess.run(command, env=env, timeout=children.HANG_LIMIT)
    assert done.returncode == 0  # what os._exit(0) leaves: nothing to see in the exit code
    assert _runs(tmp_path / "r.db") == [("running", 0)]
    Runner(EvaluationPlan(metrics=(), device="cpu", dataset={"limit": 8}), ResultStore(url),
           quiet=True).run()  # fmt: skip
    assert [status for status, _ in _runs(tmp_path / "r.db")] == ["interrupted", "finished"]


def test_a_signal_while_the_run_row_is_written_still_marks_it_interrupted(tmp_path, monkeypatch):
    """SIGTERM right after ``start_run`` committed the row, before the run's own handler is
    in place (a window a busy machine widens: the fresh-clone check saw the row stay
    'running' once): the signal is held until the row exists, then the run is marked."""
    from aisafety.store.interruption import terminate_as_interrupt

    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    start_run = store.start_run

    def start_then_signal(*args, **kwargs):
        run_id = start_run(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered before start_run returns
        return run_id

    monkeypatch.setattr(store, "start_run", start_then_signal)
    plan = EvaluationPlan(metrics=(), device="cpu", dataset={"limit": 8})
    with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
        Runner(plan, store, quiet=True).run()
    assert _runs(tmp_path / "r.db") == [("interrupted", 0)]
