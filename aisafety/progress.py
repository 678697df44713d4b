"""Progress of a whole run across its units: done/total, elapsed time and an ETA, on stderr.

Per-attack progress bars show one unit; a long run (many attacks, budgets and metrics) also
needs to say where it is overall and how long is left, and must never stay silent for long:
a heartbeat line follows every ``heartbeat`` seconds without news. Units may run one after
another (the runner) or side by side (an executor spreading them over workers): every method
is thread-safe, keyed by the unit's key.

The ETA is the sum over the units left of their expected cost: the mean time of the finished
units of the same group (the same attack configuration at other budgets costs about the
same), else the mean of all finished units. Units taken from the database (``--resume``)
count as done and do not enter the means. With ``workers`` running units side by side (a
Ray cluster), that sum is shared among them: the ETA is the sum over min(workers, units
left); an executor that times units on its workers passes their own ``seconds``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm


@dataclass
class UnitProgress:
    key: str
    description: str
    group: str
    started: float | None = None
    seconds: float | None = None  # set when finished
    resumed: bool = False
    failed: bool = False  # finished without a result: not timed


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
        heartbeat: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        workers: int = 1,
        remote: bool = False,
    ):
        self.units = {key: UnitProgress(key, d, unit_group(d)) for key, d in units}
        self.enabled = enabled
        self.stream = stream
        self.heartbeat = heartbeat
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
        if enabled and heartbeat > 0:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="aisafety-eta")
            self._thread.start()

    # -- what the caller reports ------------------------------------------------------------

    def start(self, key: str) -> None:
        with self._lock:
            unit = self.units[key]
            unit.started = self.clock()
            self._say(f"{self._position(unit)} {unit.description} ...")

    def finish(self, key: str, seconds: float | None = None) -> None:
        """``seconds``: the unit's own time where it ran elsewhere (a Ray worker)."""
        with self._lock:
            unit = self.units[key]
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

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left (None before any unit has been timed): expected cost of each unit not
        finished, less the time a running one has already spent."""
        now = self.clock() if now is None else now
        timed = [
            u for u in self.units.values() if u.seconds is not None and not (u.resumed or u.failed)
        ]
        if not timed:
            return None
        overall = sum(u.seconds for u in timed) / len(timed)
        by_group: dict[str, list[float]] = {}
        for u in timed:
            by_group.setdefault(u.group, []).append(u.seconds)
        left, count = 0.0, 0
        for u in self.units.values():
            if u.seconds is not None:
                continue
            costs = by_group.get(u.group)
            expected = sum(costs) / len(costs) if costs else overall
            if u.started is not None:
                expected = max(expected - (now - u.started), 0.0)
            left += expected
            count += 1
        return left / max(1, min(self.workers, count))

    def summary(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        eta = self.eta(now)
        left = "ETA unknown until a unit finishes" if eta is None else (
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

    def _beat(self) -> None:
        """A line every ``heartbeat`` seconds without other news, naming what is running."""
        while not self._closed.is_set():
            if self._news.wait(self.heartbeat):
                self._news.clear()
                continue
            with self._lock:
                running = [
                    u for u in self.units.values() if u.started is not None and u.seconds is None
                ]
                now = self.clock()
                left = len(self.units) - self.done
                if self.remote and left:
                    self._say(f"  {left} unit(s) running or queued on {self.workers} "
                              f"worker(s); {self.summary(now)}")  # fmt: skip
                    continue
                if not running:
                    continue
                names = ", ".join(
                    f"{u.description} ({format_duration(now - u.started)})" for u in running[:3]
                )
                more = f" and {len(running) - 3} more" if len(running) > 3 else ""
                self._say(f"  running {names}{more}; {self.summary(now)}")
