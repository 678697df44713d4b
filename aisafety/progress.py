"""Progress of a whole run across its units: done/total, elapsed time and an ETA, on stderr.

Per-attack progress bars show one unit; a long run (many attacks, budgets and metrics) also
needs to say where it is overall and how long is left, and must never stay silent for long.
Units may run one after another (the runner) or side by side (an executor spreading them over
workers): every method is thread-safe, keyed by the unit's key.

Inside a unit, an attack counts its batches, ensemble members, targets, restarts, iterations
and queries on the unit's ``WorkMeter`` (aisafety/attack/work.py). Every ``heartbeat``
seconds without other news, a line names the position reached in each running unit, if it
moved since the last line; a unit that stands still is reported once per ``STALL`` seconds,
saying so. A heartbeat thus never repeats itself, and neither does its estimate.

The ETA is the sum over the units left of their expected cost, recomputed at every line: a
running unit with a position costs what its measured rate says (elapsed x (1 - f) / f at
fraction f done); a unit not started costs the mean time of the finished units of its group
(the same attack configuration at other budgets costs about the same), else the mean of all
finished units, else the projected total of a running unit. A running unit without a
position that has outlasted its group's mean makes the ETA unknown (never "0:00 left").
Units taken from the database (``--resume``) count as done and do not enter the means. With
``workers`` running units side by side (a Ray cluster), that sum is shared among them: the
ETA is the sum over min(workers, units left); an executor that times units on its workers
passes their own ``seconds``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm

from aisafety.attack.work import Position, WorkMeter, activate, deactivate
from aisafety.errors import ConfigError

STALL = 60.0  # s: a unit whose position has not moved is reported this often, saying so


def _projected(unit: UnitProgress, now: float, position: Position | None) -> float | None:
    """The running unit's total time at its measured rate (None without a position)."""
    if position is None or position.fraction <= 0:
        return None
    return (now - unit.started) / position.fraction


def heartbeat_seconds(default: float = 5.0) -> float:
    """The heartbeat interval: ``AISAFETY_HEARTBEAT`` (seconds, > 0) if set, else ``default``."""
    raw = os.environ.get("AISAFETY_HEARTBEAT")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(
            f"AISAFETY_HEARTBEAT={raw!r} is not a number of seconds above 0; set it to e.g. 5 "
            "or unset it"
        )
    return value


@dataclass
class UnitProgress:
    key: str
    description: str
    group: str
    started: float | None = None
    seconds: float | None = None  # set when finished
    resumed: bool = False
    failed: bool = False  # finished without a result: not timed
    meter: WorkMeter | None = None  # its attack's position, while it runs here
    token: object = None  # the meter's activation in the thread that runs it
    shown: str | None = None  # the position its last heartbeat line named
    shown_at: float = 0.0  # when a heartbeat line last named it
    moved_at: float = 0.0  # when that position was first named
    # its total time as last projected from a position; kept while a new inner pass has
    # opened its counters but not yet moved (0%: no rate to measure yet)
    projected_total: float | None = None

    def position(self) -> Position | None:
        return None if self.meter is None else self.meter.position()


def unit_group(description: str) -> str:
    """The group of a unit: its attack configuration ("pgd-linf(steps=40) eps=0.1" ->
    "pgd-linf(steps=40)"); the clean unit is a group of its own."""
    return description.rsplit(" eps=", 1)[0]


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RunProgress:
    """``start(key)`` / ``finish(key)`` / ``resume(key)`` for each unit; ``close()`` at the end
    (or use it as a context manager)."""

    def __init__(
        self,
        units: Iterable[tuple[str, str]],
        enabled: bool = True,
        stream: TextIO | None = None,
        heartbeat: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        workers: int = 1,
        remote: bool = False,
    ):
        self.units = {key: UnitProgress(key, d, unit_group(d)) for key, d in units}
        self.enabled = enabled
        self.stream = stream
        self.heartbeat = heartbeat_seconds() if heartbeat is None else heartbeat
        self.clock = clock
        self.workers = max(1, workers)  # units that run at once
        # units run elsewhere (a Ray cluster): when each starts is not seen here, so the
        # heartbeat names how many are left instead of what is running
        self.remote = remote
        self.begun = clock()
        self._lock = threading.Lock()
        self._news = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat = ""  # a heartbeat line is never the same as the one before
        if enabled and self.heartbeat > 0:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="aisafety-eta")
            self._thread.start()

    # -- what the caller reports ------------------------------------------------------------

    def start(self, key: str) -> None:
        """Call in the thread that runs the unit: its attack counts on the unit's meter."""
        with self._lock:
            unit = self.units[key]
            unit.started = self.clock()
            unit.meter = WorkMeter()
            unit.token = activate(unit.meter)
            self._say(f"{self._position(unit)} {unit.description} ...")

    def finish(self, key: str, seconds: float | None = None) -> None:
        """``seconds``: the unit's own time where it ran elsewhere (a Ray worker)."""
        with self._lock:
            unit = self.units[key]
            self._stop_meter(unit)
            now = self.clock()
            unit.seconds = now - (unit.started if unit.started is not None else now)
            if seconds is not None:
                unit.seconds = seconds
            self._say(
                f"{self._position(unit)} {unit.description}: {unit.seconds:.1f} s "
                f"({self.summary(now)})"
            )

    def fail(self, key: str, error: str) -> None:
        """A unit that ended without a result (its error is stored): done, not timed."""
        with self._lock:
            unit = self.units[key]
            self._stop_meter(unit)
            unit.failed, unit.seconds = True, 0.0
            self._say(f"{self._position(unit)} {unit.description}: FAILED ({error}; "
                      f"{self.summary()})")  # fmt: skip

    def resume(self, key: str) -> None:
        with self._lock:
            unit = self.units[key]
            unit.resumed, unit.seconds = True, 0.0
            self._say(f"{self._position(unit)} {unit.description}: taken from the database")

    def close(self) -> None:
        self._closed.set()
        self._news.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what it reports ----------------------------------------------------------------------

    @property
    def done(self) -> int:
        return sum(u.seconds is not None for u in self.units.values())

    def eta(
        self, now: float | None = None, positions: dict[str, Position | None] | None = None
    ) -> float | None:
        """Seconds left, or None when nothing measured says: each unit not finished at its
        expected cost (a running one at its measured rate, less the time it has spent).
        ``positions``: the running units' positions as a heartbeat line shows them (one
        snapshot for its text and its estimate); read now when not given."""
        now = self.clock() if now is None else now
        if positions is None:
            positions = {u.key: u.position() for u in self.units.values() if u.meter is not None}
        timed = [
            u for u in self.units.values() if u.seconds is not None and not (u.resumed or u.failed)
        ]
        by_group: dict[str, list[float]] = {}
        for u in timed:
            by_group.setdefault(u.group, []).append(u.seconds)
        running = [u for u in self.units.values() if u.started is not None and u.seconds is None]
        projected = [
            t for u in running if (t := _projected(u, now, positions.get(u.key))) is not None
        ]
        fallback = (
            sum(u.seconds for u in timed) / len(timed)
            if timed
            else (sum(projected) / len(projected) if projected else None)
        )
        left, count = 0.0, 0
        for u in self.units.values():
            if u.seconds is not None:
                continue
            costs = by_group.get(u.group)
            expected = sum(costs) / len(costs) if costs else fallback
            if u.started is not None:
                expected = self._left_of_running(u, now, expected, positions.get(u.key))
            if expected is None:
                return None
            left += expected
            count += 1
        return left / max(1, min(self.workers, count))

    @staticmethod
    def _left_of_running(
        unit: UnitProgress, now: float, expected: float | None, position: Position | None
    ) -> float | None:
        total = _projected(unit, now, position)
        if total is not None:
            unit.projected_total = total
            return total - (now - unit.started)
        if position is not None and unit.projected_total is not None:  # a pass at 0%
            return max(0.0, unit.projected_total - (now - unit.started))
        if expected is None or expected <= now - unit.started:
            return None  # no position and past the estimate: unknown, not "0:00"
        return expected - (now - unit.started)

    def summary(
        self, now: float | None = None, positions: dict[str, Position | None] | None = None
    ) -> str:
        now = self.clock() if now is None else now
        eta = self.eta(now, positions)
        left = "ETA unknown until a unit finishes or reports its position" if eta is None else (
            f"about {format_duration(eta)} left"
        )  # fmt: skip
        return (
            f"{self.done}/{len(self.units)} units done, {format_duration(now - self.begun)} "
            f"elapsed, {left}"
        )

    def _position(self, unit: UnitProgress) -> str:
        index = list(self.units).index(unit.key) + 1
        return f"[{index}/{len(self.units)}]"

    def _say(self, line: str) -> None:
        if self.enabled:
            tqdm.write(line, file=self.stream or sys.stderr)  # clears and redraws open bars
            self._news.set()

    def _stop_meter(self, unit: UnitProgress) -> None:
        if unit.token is not None:
            with contextlib.suppress(ValueError):  # finished in another thread than started
                deactivate(unit.token)
        unit.meter, unit.token = None, None

    def _beat(self) -> None:
        """A line every ``heartbeat`` seconds without other news, naming what is running."""
        while not self._closed.is_set():
            if self._news.wait(self.heartbeat):
                self._news.clear()
                continue
            with self._lock:
                self._beat_line()

    def _beat_line(self) -> None:
        running = [u for u in self.units.values() if u.started is not None and u.seconds is None]
        now = self.clock()
        left = len(self.units) - self.done
        if self.remote and left:
            line = f"  {left} unit(s) running or queued on {self.workers} worker(s); "
            line += self.summary(now)
            if line != self._last_beat:
                self._last_beat = line
                self._say(line)
            return
        if not running:
            return
        positions = {u.key: u.position() for u in running}  # one snapshot for the line
        texts = [self._running_text(u, now, positions[u.key]) for u in running[:3]]
        if all(t is None for t in texts):
            return  # nothing moved, and nothing has stood still for STALL seconds yet
        names = ", ".join(t for t in texts if t is not None)
        more = f" and {len(running) - 3} more" if len(running) > 3 else ""
        line = f"  running {names}{more}; {self.summary(now, positions)}"
        if line != self._last_beat:
            self._last_beat = line
            self._say(line)

    @staticmethod
    def _running_text(unit: UnitProgress, now: float, position: Position | None) -> str | None:
        """``desc (elapsed): position, n% of the unit``; None for a unit whose position has
        not moved since its last line, unless that was STALL seconds ago (then it says so)."""
        elapsed = format_duration(now - unit.started)
        if position is None:
            return f"{unit.description} ({elapsed})"
        if position.text == unit.shown:
            if now - unit.shown_at < STALL:
                return None
            unit.shown_at = now
            return (f"{unit.description} ({elapsed}): still at {position.text}, for "
                    f"{format_duration(now - unit.moved_at)}")  # fmt: skip
        unit.shown, unit.shown_at, unit.moved_at = position.text, now, now
        return (f"{unit.description} ({elapsed}): {position.text}, "
                f"{100 * position.fraction:.0f}% of the unit")  # fmt: skip
