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

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


class OutOfTime(Exception):
    """The instance's time limit passed during a bound, attack or search phase."""


@dataclass(frozen=True)
class Deadline:
    at: float  # in ``clock``'s seconds
    clock: Callable[[], float]

    def left(self) -> float:
        return self.at - self.clock()

    def passed(self) -> bool:
        return self.left() <= 0


_CURRENT: ContextVar[Deadline | None] = ContextVar("verification_deadline", default=None)


@contextmanager
def time_limit(deadline: Deadline) -> Iterator[Deadline]:
    """``check_time`` inside this block raises ``OutOfTime`` once ``deadline`` passed."""
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


def current() -> Deadline | None:
    """The deadline of the enclosing ``time_limit`` (None outside one)."""
    return _CURRENT.get()


def check_time() -> None:
    deadline = _CURRENT.get()
    if deadline is not None and deadline.passed():
        raise OutOfTime
