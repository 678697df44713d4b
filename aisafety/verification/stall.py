"""When a search has stopped improving, so its time goes to another route (#33).

``vnncomp``'s one-atom route gives a conjunction's most promising atom its own branch and
bound (``bab``) with all the time left after a short probe of the joint search over all
the atoms (``conjunction_search.py``). The joint search takes over when the atom's search
stands below the probe at the same age (``rival``), or once it has stalled: the joint
search starts again from its root, so a handover while the atom's bound still rises
faster costs the margin the atom would have gained (docs/certification.md, "The time
between the two routes").

The rule compares the search's rise over the last half of its time with its rise over
the quarter before. After each round the search reports its lowest bound (``report``);
with e the time since its first report, b(t) its bound at t (since that report), once it
has run ``FIRST_SLICE`` of its time it has stalled when

    b(e) - b(e / 2) <= STALL_RATIO * (b(e / 2) - b(e / 4))

A bound rising like a log, a ln t (a tree of splits, each level a fixed rise; the shape
measured on the Marabou nets' best atoms, ratio 0.76-1.09 after 10 s), has ratio 1 and
never stalls; one closing in on a limit as fast as c - a / t has ratio 1/2 and stalls,
and so does a flat one (the atom's true minimum is near, or below 0, where no search of
that atom alone can pass 0). The first slice is the search's own: its first rounds split
a handful of domains each, so the bound leaps there (ratio 0.39-0.47 at 5 s on the same
atoms). ``report`` then raises ``Stalled``, an ``OutOfTime``: the search ends as at its
deadline, with its anytime bound.

Outside ``watching`` ``report`` does nothing (every other use of ``bab``).
"""

from __future__ import annotations

import bisect
import math
from contextlib import AbstractContextManager
from contextvars import ContextVar

from aisafety.scoped import scoped
from aisafety.verification.deadline import Deadline, OutOfTime

FIRST_SLICE = 0.1  # of the watched time, always the search's own
STALL_RATIO = 0.5  # stalled when the last half's rise is at most this of the quarter's before


class Stalled(OutOfTime):
    """The watched search's bound stopped rising (the rule above)."""


class StallWatch:
    """The bounds a search reported, on ``deadline``'s clock, and whether it stalled."""

    def __init__(self, deadline: Deadline, rival: tuple[float, float] | None = None):
        """``rival``: (seconds, bound) another route reached in that many seconds of its
        own; at the first report after as many seconds, a bound below it stops this search
        (the other route rose faster: the equal-age rule)."""
        self.clock = deadline.clock
        self.start = self.clock()
        self.first_slice_ends = self.start + FIRST_SLICE * max(deadline.left(), 0.0)
        self.rival = rival
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
        behind = False
        if self.rival is not None and now - self.start >= self.rival[0]:
            behind, self.rival = bound < self.rival[1], None
        if behind or (now >= self.first_slice_ends and self._flat(now, bound)):
            self.stalled = True
            raise Stalled

    def _flat(self, now: float, bound: float) -> bool:
        """The last half's rise at most ``STALL_RATIO`` of the quarter's before."""
        elapsed = now - self.times[0]
        half, quarter = self._at(now - elapsed / 2), self._at(now - 3 * elapsed / 4)
        return bound - half <= STALL_RATIO * (half - quarter)

    def _at(self, t: float) -> float:
        """The bound reported last at or before ``t``."""
        return self.bounds[max(bisect.bisect_right(self.times, t) - 1, 0)]


_WATCH: ContextVar[StallWatch | None] = ContextVar("verification_stall_watch", default=None)


def watching(watch: StallWatch) -> AbstractContextManager[StallWatch]:
    """``report`` inside this block records into ``watch`` (and may raise ``Stalled``)."""
    return scoped(_WATCH, watch)


def watched() -> bool:
    """Whether a watch is open (so a search need not compute its bound for nothing)."""
    return _WATCH.get() is not None


def report(bound: float) -> None:
    watch = _WATCH.get()
    if watch is not None:
        watch.note(bound)
