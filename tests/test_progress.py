"""Overall progress across a run's units: done/total, elapsed, an ETA, and a heartbeat."""

from __future__ import annotations

import io
import re
import time

import pytest

from aisafety.config import plan_from_dict
from aisafety.database.store import ResultStore
from aisafety.progress import RunProgress, format_duration, unit_group
from aisafety.runner import Runner


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


UNITS = [
    ("k0", "clean metrics on mnist-embedded"),
    ("k1", "pgd-linf(steps=40) eps=0.1"),
    ("k2", "pgd-linf(steps=40) eps=0.3"),
    ("k3", "fgsm eps=0.1"),
]


def _run_unit(progress: RunProgress, clock: FakeClock, key: str, seconds: float) -> None:
    progress.start(key)
    clock.now += seconds
    progress.finish(key)


def test_eta_uses_the_same_attack_at_other_budgets_then_the_overall_mean():
    clock, out = FakeClock(), io.StringIO()
    progress = RunProgress(UNITS, stream=out, heartbeat=0, clock=clock)
    assert progress.eta() is None
    _run_unit(progress, clock, "k0", 2.0)
    assert progress.eta() == pytest.approx(3 * 2.0)  # nothing else timed: the overall mean
    _run_unit(progress, clock, "k1", 10.0)
    # k2 is pgd-linf at another budget: 10 s; k3 (fgsm, not timed yet): mean of (2, 10) = 6 s
    assert progress.eta() == pytest.approx(10.0 + 6.0)
    progress.start("k2")
    clock.now += 4.0  # 4 s into k2: 6 s of it left
    assert progress.eta() == pytest.approx(6.0 + 6.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/4] clean metrics on mnist-embedded ..."
    assert lines[1] == "[1/4] clean metrics on mnist-embedded: 2.0 s (1/4 units done, 0:02 " \
        "elapsed, about 0:06 left)"  # fmt: skip
    assert lines[3].startswith("[2/4] pgd-linf(steps=40) eps=0.1: 10.0 s (2/4 units done, 0:12")


def test_resumed_units_count_as_done_but_not_in_the_timing():
    clock, out = FakeClock(), io.StringIO()
    progress = RunProgress(UNITS, stream=out, heartbeat=0, clock=clock)
    progress.resume("k0")
    assert progress.done == 1 and progress.eta() is None
    _run_unit(progress, clock, "k1", 8.0)
    assert progress.eta() == pytest.approx(8.0 + 8.0)
    assert "[1/4] clean metrics on mnist-embedded: taken from the database" in out.getvalue()


def test_a_long_unit_is_never_silent():
    out = io.StringIO()
    with RunProgress(UNITS, stream=out, heartbeat=0.05) as progress:
        progress.start("k0")
        deadline = time.monotonic() + 10
        while "running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        progress.finish("k0")
    beat = [line for line in out.getvalue().splitlines() if "running" in line]
    assert beat and re.match(
        r"  running clean metrics on mnist-embedded \(0:0\d\); 0/4 units", beat[0]
    )


def test_units_on_a_cluster_are_never_silent_either():
    """A Ray run does not see its units start: the heartbeat says how many are left."""
    out = io.StringIO()
    with RunProgress(UNITS, stream=out, heartbeat=0.05, workers=2, remote=True) as progress:
        progress.finish("k0", seconds=3.0)
        deadline = time.monotonic() + 10
        while "queued" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
    beat = [line for line in out.getvalue().splitlines() if "queued" in line]
    assert beat and re.match(
        r"  3 unit\(s\) running or queued on 2 worker\(s\); 1/4 units done, 0:00 elapsed, "
        r"about 0:0\d left",
        beat[0],
    )


def test_disabled_progress_prints_nothing():
    out = io.StringIO()
    with RunProgress(UNITS, enabled=False, stream=out, heartbeat=0.01) as progress:
        progress.start("k0")
        time.sleep(0.05)
        progress.finish("k0")
    assert out.getvalue() == ""


def test_helpers():
    assert unit_group("pgd-linf(steps=40) eps=0.3") == "pgd-linf(steps=40)"
    assert unit_group("clean metrics on mnist") == "clean metrics on mnist"
    assert format_duration(65) == "1:05" and format_duration(3725) == "1:02:05"


def test_a_run_reports_every_unit_on_stderr_and_nothing_on_stdout(tmp_path, capsys):
    plan = plan_from_dict({
        "dataset": {"name": "mnist-embedded", "limit": 20},
        "attacks": [{"name": "fgsm", "eps": [0.1, 0.3]}],
        "metrics": ["ca", "aaw"],
    })  # fmt: skip
    Runner(plan, ResultStore(f"sqlite:///{tmp_path / 'r.db'}"), quiet=False).run()
    captured = capsys.readouterr()
    assert captured.out == ""
    for i, what in enumerate(["clean metrics", "fgsm eps=0.1", "fgsm eps=0.3"], start=1):
        assert re.search(rf"\[{i}/3\] {what}.*: \d+\.\d s \({i}/3 units done", captured.err)
    Runner(plan, ResultStore(f"sqlite:///{tmp_path / 'r.db'}"), resume=True).run()
    assert "[2/3] fgsm eps=0.1: taken from the database" in capsys.readouterr().err
