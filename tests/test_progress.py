"""Overall progress across a run's units: done/total, elapsed, an ETA, and a heartbeat."""

from __future__ import annotations

import io
import os
import re
import sys
import time

import children
import pytest

from aisafety.attack.work import WorkMeter, activate, counted, deactivate
from aisafety.config import plan_from_dict
from aisafety.progress import RunProgress, format_duration, unit_group
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


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
        deadline = time.monotonic() + 600  # a hang guard
        while "running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        progress.finish("k0")
    beat = [line for line in out.getvalue().splitlines() if "running" in line]
    assert beat and re.match(
        r"  running clean metrics on mnist-embedded \(\d+:\d\d\); 0/4 units", beat[0]
    )


def test_units_on_a_cluster_are_never_silent_either():
    """A Ray run does not see its units start: the heartbeat says how many are left."""
    out = io.StringIO()
    with RunProgress(UNITS, stream=out, heartbeat=0.05, workers=2, remote=True) as progress:
        progress.finish("k0", seconds=3.0)
        deadline = time.monotonic() + 600  # a hang guard
        while "queued" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
    beat = [line for line in out.getvalue().splitlines() if "queued" in line]
    assert beat and re.match(
        r"  3 unit\(s\) running or queued on 2 worker\(s\); 1/4 units done, \d+:\d\d elapsed, "
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


LONG_STANDARD = """\
model: {name: mnist-cnn}
dataset: {name: mnist-embedded, limit: 20}
attacks:
  - {name: standard, config: {steps: 10, queries: 100}, eps: [0.02]}
metrics: [ca, robust-accuracy]
"""
BEAT = re.compile(r"running standard\(queries=100,steps=10\) eps=0\.02 \([\d:]+\): (?P<at>.+?), "
                  r"(?P<pct>\d+)% of the unit; (?P<summary>.+)$")  # fmt: skip


def test_a_long_ensemble_unit_reports_a_new_position_inside_it_at_every_heartbeat(tmp_path):
    """``aisafety evaluate`` of one long ``standard`` unit (4 members, 9 targets each, 10
    iterations): with a 0.05 s heartbeat, every heartbeat line inside the unit names a new
    position (member, target, iteration) and a recomputed estimate, never the line before.
    Bounded by positions: a busy machine makes more lines, not fewer or failing ones."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(LONG_STANDARD)
    done = children.run(
        [sys.executable, "-m", "aisafety.cli", "evaluate", str(plan), "--db",
         f"sqlite:///{tmp_path / 'r.db'}"],
        capture_output=True, text=True, what="aisafety evaluate of one standard unit",
        env={**os.environ, "AISAFETY_HEARTBEAT": "0.05", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = re.split(r"[\r\n]", done.stderr)
    beats = [m for line in lines if (m := BEAT.search(line))]
    positions = [m["at"] for m in beats]
    assert len(positions) >= 5, "\n".join(lines[-40:])
    for before, after in zip(positions, positions[1:], strict=False):
        assert before != after, f"a heartbeat repeated the position {before!r}"
    members = {re.search(r"member \d/4 (\S+)", p).group(1) for p in positions if "member" in p}
    assert len(members) >= 2, positions  # positions inside the unit, across members
    assert any("iteration" in p or "query" in p for p in positions), positions
    assert all("still at" not in line for line in lines)
    assert "ETA unknown" not in beats[-1]["summary"]  # measured from the work in flight


def test_a_position_is_the_nested_fraction_of_the_counted_levels():
    """Hand-computed: batch 2 of 4 (1 done), member 2 of 2 (1 done), iteration 5 of 10 done:
    (1 + (1 + 5/10) / 2) / 4 = 0.4375."""
    meter = WorkMeter()
    token = activate(meter)
    try:
        assert meter.position() is None
        for batch in counted("batch", 4):
            for member in counted("member", 2, ["apgd-ce", "square-linf"]):
                for step in counted("iteration", 10):
                    if (batch, member, step) == (1, 1, 5):
                        at = meter.position()
                    if step == 5:
                        break  # an attack that stops early leaves no level behind
        assert meter.position() is None
    finally:
        deactivate(token)
    assert at.fraction == pytest.approx(0.4375)
    assert at.text == "batch 2/4, member 2/2 square-linf, iteration 5/10"
    assert list(counted("iteration", 3)) == [0, 1, 2]  # no meter: a plain range


def test_the_estimate_of_a_running_unit_is_its_measured_rate():
    """10 s in and a quarter done: 30 s left, whatever the finished units took; without a
    position, a unit past its group's mean makes the estimate unknown, never 0:00."""
    now = [0.0]
    progress = RunProgress(UNITS, stream=io.StringIO(), heartbeat=0, clock=lambda: now[0])
    progress.finish("k0", seconds=1.0)
    progress.start("k1")
    try:
        meter = progress.units["k1"].meter
        steps = counted("iteration", 4)
        next(steps)
        next(steps)  # one of 4 iterations done
        now[0] = 10.0
        assert meter.position().fraction == pytest.approx(0.25)
        # k1: 30 s left; k2, k3 (same group, none finished): the clean unit's 1 s each
        assert progress.eta() == pytest.approx(30.0 + 2 * 1.0)
        steps.close()
        assert progress.eta() is None  # no position, 10 s past the 1 s the clean unit took
    finally:
        progress.finish("k1")


def test_a_new_inner_pass_at_zero_keeps_the_last_measured_estimate():
    """An attack that opens another pass inside its unit (a member's own batch counter) is
    at 0% of it for a moment: no rate yet, so the unit's last projection holds, not
    "unknown" (a heartbeat there said "ETA unknown" right after 88% of the unit)."""
    now = [0.0]
    progress = RunProgress(UNITS, stream=io.StringIO(), heartbeat=0, clock=lambda: now[0])
    progress.finish("k0", seconds=1.0)
    progress.start("k1")
    try:
        steps = counted("iteration", 4)
        next(steps)
        next(steps)  # a quarter done at 10 s: 40 s in all
        now[0] = 10.0
        assert progress.eta() == pytest.approx(30.0 + 2 * 1.0)
        steps.close()
        again = counted("batch", 1)
        next(again)  # a new pass, nothing of it done
        now[0] = 12.0
        assert progress.units["k1"].position().fraction == 0
        assert progress.eta() == pytest.approx(28.0 + 2 * 1.0)
        again.close()
    finally:
        progress.finish("k1")
