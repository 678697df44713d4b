"""kill -9 at random points of a run, then --resume: no unit lost or duplicated, no partial
unit counted as finished, the resumed numbers bit-identical to an uninterrupted run, and
the killed run marked 'interrupted' by the next one (docs/reliability.md).

Three trials run by default; ``pytest -m slow`` runs the twenty-trial version.
"""

from __future__ import annotations

import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import children
import pytest
import torch

from aisafety.interfaces import EvaluationPlan
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

PLAN = EvaluationPlan.model_validate(
    {
        "dataset": {"limit": 20},
        "attacks": [
            {"name": "fgsm", "eps": [0.1, 0.2, 0.3]},
            {"name": "pgd-linf", "config": {"steps": 3}, "eps": [0.1, 0.2]},
        ],
        "metrics": ["ca", "aaw", "ald"],
        "device": "cpu",
    }
)
UNITS = 6  # the clean unit and five (attack, eps) units

CHILD = """
import sys, torch
torch.set_num_threads(1)
from aisafety.store.results import ResultStore
from aisafety.interfaces import EvaluationPlan
from aisafety.runner import Runner
plan = EvaluationPlan.model_validate_json(sys.argv[2])
Runner(plan, ResultStore(sys.argv[1]), resume=True, quiet=True).run()
"""


def _single_thread(run):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the child: identical kernels, identical bits
    try:
        return run()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.db"
    record = _single_thread(
        lambda: Runner(PLAN, ResultStore(f"sqlite:///{path}"), quiet=True).run()
    )
    return _values(record)


def _values(record) -> dict:
    return {(v.metric, v.attack, v.eps): v.value for v in record.values}


def _units_written(path) -> int:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as connection:
            return connection.execute("SELECT COUNT(*) FROM units").fetchone()[0]
    except sqlite3.Error:
        return 0


def _kill_at_random_point(path, rng: random.Random) -> int:
    """Start a run, kill -9 it after a random number of committed units plus a random delay
    (so that kills land inside units and inside commits too); the units done at the kill."""
    child = children.start(
        [sys.executable, "-c", CHILD, f"sqlite:///{path}", PLAN.model_dump_json()],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    target, delay = rng.randint(0, UNITS - 1), rng.uniform(0.0, 0.4)
    deadline = time.monotonic() + children.HANG_LIMIT  # a hang guard: the loop waits for units
    while child.poll() is None and _units_written(path) < target and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    os.killpg(child.pid, signal.SIGKILL)  # kill -9, the child's whole group: no clean-up
    child.wait()
    return _units_written(path)


def _trial(tmp_path, seed: int, reference: dict) -> dict:
    path = tmp_path / f"trial-{seed}.db"
    written = _kill_at_random_point(path, random.Random(seed))
    store = ResultStore(f"sqlite:///{path}")
    finished = store.finished_units()
    assert len(finished) == written  # every unit row written is complete: nothing partial
    record = _single_thread(lambda: Runner(PLAN, store, resume=True, quiet=True).run())
    assert record.resumed_units == len(finished)  # nothing finished is lost or redone
    assert len(store.finished_units()) == UNITS
    _, units = store.query("SELECT COUNT(*) FROM units")
    assert units == [(UNITS,)]  # no duplicated unit
    resumed = _values(record)
    assert resumed.keys() == reference.keys()
    for key, value in reference.items():  # bit-identical, NaN included
        assert (math.isnan(value) and math.isnan(resumed[key])) or resumed[key] == value, key
    _, statuses = store.query("SELECT status FROM runs ORDER BY id")
    assert statuses[-1] == ("finished",)
    if len(statuses) == 2 and written < UNITS:  # killed mid-run: the next run marked it
        assert statuses[0] == ("interrupted",)
    return {"units_at_kill": written, "resumed": record.resumed_units}


@pytest.mark.parametrize("seed", range(3))
def test_kill_9_then_resume(tmp_path, reference, seed):
    _trial(tmp_path, seed, reference)


@pytest.mark.slow
def test_kill_9_twenty_trials(tmp_path, reference):
    outcomes = [_trial(tmp_path, 100 + seed, reference) for seed in range(20)]
    print("\nunits committed at each kill:", [o["units_at_kill"] for o in outcomes])
