"""When a search has stopped improving, so its time goes to another route (#33).

``vnncomp``'s one-atom route gives a conjunction's most promising atom its own branch and
bound (``bab``) with all the time left. The joint search over all the atoms
(``conjunction_search.py``) takes over only once that search has stalled: it starts
again from the root, so a handover while the atom's bound still rises costs the margin
the atom would have gained (docs/certification.md, "The time between the two routes").

The rule compares the search's rate over its last slice with its average rate. After each
round the search reports its lowest bound (``report``). Once it has run ``FIRST_SLICE`` of
its time, it has stalled when the bound rose over the last ``SLICE`` of the time since its
first round by at most ``STALL_RATIO`` of the average rise over that length:

    b_now - b(t_now - SLICE e) <= STALL_RATIO * SLICE * (b_now - b_first),   e = t_now - t_first

A bound rising like a log a ln t (a tree of splits, each level a fixed rise) stalls only
when ln(t / t_first) >= 1 / (STALL_RATIO * SLICE) * ln(1 / (1 - SLICE)), about 11.5: never
within a limit. A bound that flattens (the atom's true minimum is near, or below 0, where
no search of that atom alone can pass 0) stalls. ``report`` then raises ``Stalled``, an
``OutOfTime``: the search ends as at its deadline, with its anytime bound.

Outside ``watching`` ``report`` does nothing (every other use of ``bab``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from aisafety.verification.deadline import Deadline, OutOfTime

FIRST_SLICE = 0.1  # of the watched time, always the search's own
SLICE = 0.25  # the last slice: this share of the time since the first round
STALL_RATIO = 0.1  # stalled at a last-slice rate at most this share of the average


class Stalled(OutOfTime):
    """The watched search's bound stopped rising (the rule above)."""


class StallWatch:
    """The bounds a search reported, on ``deadline``'s clock, and whether it stalled."""

    def __init__(self, deadline: Deadline):
        self.clock = deadline.clock
        self.first_slice_ends = self.clock() + FIRST_SLICE * max(deadline.left(), 0.0)
        self.times: list[float] = []
        self.bounds: list[float] = []
        self.stalled = False

    def note(self, bound: float) -> None:
        """Record the search's lowest bound now; raise ``Stalled`` where the rule says so.
        An infinite bound (no domain open yet, or all proved) is not a point of the curve."""
        if not math.isfinite(bound):
            return
        now = self.clock()
        self.times.append(now)
        self.bounds.append(bound)
        if now >= self.first_slice_ends and self._flat(now, bound):
            self.stalled = True
            raise Stalled

    def _flat(self, now: float, bound: float) -> bool:
        elapsed = now - self.times[0]
        if elapsed <= 0:
            return False
        # the bound at the start of the last slice: the last report at or before it
        at = bisect.bisect_right(self.times, now - SLICE * elapsed) - 1
        rise = bound - self.bounds[max(at, 0)]
        return rise <= STALL_RATIO * SLICE * (bound - self.bounds[0])


_WATCH: ContextVar[StallWatch | None] = ContextVar("verification_stall_watch", default=None)


@contextmanager
def watching(watch: StallWatch) -> Iterator[StallWatch]:
    """``report`` inside this block records into ``watch`` (and may raise ``Stalled``)."""
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def watched() -> bool:
    """Whether a watch is open (so a search need not compute its bound for nothing)."""
    return _WATCH.get() is not None


def report(bound: float) -> None:
    watch = _WATCH.get()
    if watch is not None:
        watch.note(bound)
