"""The per-instance time limit of a verifier: one clock, checked by every long phase.

A verifier enters ``time_limit(deadline)`` around a batch's work; the bound passes (each
op of a backward pass, each slope-optimisation step, each box-PGD step) call
``check_time()``, which raises ``OutOfTime`` once the deadline has passed. So an instance
over its limit ends as ``timeout`` whichever phase its time went to, and never as a
certificate. Outside ``time_limit`` ``check_time`` does nothing (training bounds, attacks).

Clocks: ``wall`` (``time.perf_counter``: the SoK's limit, meant for a dedicated machine)
and ``cpu`` (``time.process_time``: this process's CPU seconds over all its threads; a
one-thread run on a shared machine gets the same budget whatever the load).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass

from aisafety.scoped import scoped

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}

# on the CPU clock, HiGHS's wall-clock limit is this many times the CPU seconds left: a
# process at a tenth of a core still reaches its CPU deadline, which is what stops HiGHS
WALL_BACKSTOP = 10.0


class OutOfTime(Exception):
    """The instance's time limit passed during a bound, attack or search phase."""


@dataclass(frozen=True)
class Deadline:
    at: float  # in ``clock``'s seconds
    clock: Callable[[], float]

    def left(self) -> float:
        return self.at - self.clock()

    def wall_seconds(self) -> float:
        """A wall-clock limit for a solver that counts wall seconds (HiGHS): the seconds
        left, times ``WALL_BACKSTOP`` on the CPU clock (under load a wall second holds less
        than a CPU second, and a limit of the CPU seconds left would stop it early)."""
        factor = 1.0 if self.clock is CLOCKS["wall"] else WALL_BACKSTOP
        return max(self.left(), 0.01) * factor

    def passed(self) -> bool:
        return self.left() <= 0

    def share(self, fraction: float, at_most: float = math.inf) -> Deadline:
        """A deadline ``fraction`` of the way from now to this one, and at most ``at_most``
        seconds from now, on the same clock: a phase's part of the time left. Never later
        than this one (a share rounded past it, or of a deadline already passed, ends
        with it), so a phase within its share is within the whole."""
        now = self.clock()
        seconds = min(fraction * max(self.at - now, 0.0), at_most)
        return Deadline(min(self.at, now + seconds), self.clock)


_CURRENT: ContextVar[Deadline | None] = ContextVar("verification_deadline", default=None)


def time_limit(deadline: Deadline) -> AbstractContextManager[Deadline]:
    """``check_time`` inside this block raises ``OutOfTime`` once ``deadline`` passed."""
    return scoped(_CURRENT, deadline)


def current_deadline() -> Deadline | None:
    """The deadline of the enclosing ``time_limit`` (None outside one): for a solver's own
    time limit."""
    return _CURRENT.get()


def check_time() -> None:
    deadline = _CURRENT.get()
    if deadline is not None and deadline.passed():
        raise OutOfTime
