"""Where a running attack is inside its unit: batch, ensemble member, target, restart,
iteration or query, as nested counters that a progress display reads from another thread.

A unit of a long ensemble (``standard`` on 1,000 images) can run for minutes inside one
batch; a counter of finished batches then stands still and its estimate goes stale. The
attacks' loops count through ``counted`` instead of ``range``; while a ``WorkMeter`` is
active (``activate``, by the run's progress), each level is kept with its position, and the
fraction of the unit done is the nested sum of those positions (each item of a level weighs
the same: an estimate, recomputed at every step, not a promise). Without an active meter
``counted`` is ``range`` with a context-variable look-up.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

STEP_LABELS = frozenset({"iteration", "query"})  # counted as done; other levels as in progress
_ACTIVE: contextvars.ContextVar[WorkMeter | None] = contextvars.ContextVar(
    "aisafety_work_meter", default=None
)


@dataclass
class Level:
    label: str
    total: int
    done: int = 0
    names: Sequence[str] | None = None

    def text(self) -> str:
        """``iteration 44/100`` (steps finished) for steps; ``member 2/4 apgd-t`` (the one in
        progress) for items: batches, members, targets, restarts."""
        if self.label in STEP_LABELS:
            return f"{self.label} {self.done}/{self.total}"
        current = min(self.done, self.total - 1)
        name = f" {self.names[current]}" if self.names else ""
        return f"{self.label} {current + 1}/{self.total}{name}"


@dataclass(frozen=True)
class Position:
    """A snapshot: ``text`` for a person, ``fraction`` of the unit done, ``steps`` counted."""

    text: str
    fraction: float
    steps: int


class WorkMeter:
    """The nested counters of one unit; written by the attack, read by the heartbeat."""

    def __init__(self) -> None:
        self._levels: list[Level] = []
        self._lock = threading.Lock()
        self._steps = 0  # every counted step at any level: moves whenever anything moves

    def push(self, label: str, total: int, names: Sequence[str] | None) -> int:
        with self._lock:
            self._levels.append(Level(label, total, 0, names))
            return len(self._levels) - 1

    def advance(self, depth: int) -> None:
        with self._lock:
            if depth < len(self._levels):
                self._levels[depth].done += 1
                del self._levels[depth + 1 :]  # whatever ran inside that item has ended
                self._steps += 1

    def pop(self, depth: int) -> None:
        with self._lock:
            del self._levels[depth:]

    def position(self) -> Position | None:
        """None before any level is open."""
        with self._lock:
            levels = [Level(v.label, v.total, v.done, v.names) for v in self._levels]
            steps = self._steps
        if not levels:
            return None
        fraction, weight = 0.0, 1.0
        for level in levels:
            total = max(level.total, 1)
            fraction += weight * min(level.done, total) / total
            weight /= total
        shown = [v for v in levels if v.total > 1] or levels[-1:]
        text = ", ".join(v.text() for v in shown)
        return Position(text, min(fraction, 1.0), steps)


def activate(meter: WorkMeter | None) -> contextvars.Token:
    """Make ``meter`` the one ``counted`` writes to in this thread (``deactivate`` undoes)."""
    return _ACTIVE.set(meter)


def deactivate(token: contextvars.Token) -> None:
    _ACTIVE.reset(token)


def counted(label: str, total: int, names: Sequence[str] | None = None) -> Iterator[int]:
    """``range(total)``, each step counted on the active meter as one ``label``; ``names``
    (one per step) are shown beside the position, e.g. an ensemble's members."""
    meter = _ACTIVE.get()
    if meter is None:
        yield from range(total)
        return
    depth = meter.push(label, total, names)
    try:
        for i in range(total):
            yield i
            meter.advance(depth)
    finally:
        meter.pop(depth)
