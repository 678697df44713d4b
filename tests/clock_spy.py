"""A module's ``time`` whose ``monotonic()`` readings are kept: a deadline is checked on the
readings the code took itself (it stops at its first reading past the deadline), which no
load can move, not by the wall time around the call, which a busy machine stretches
(tests/test_query_bounds.py failed so on a loaded machine: 3.32 s for a 3 s timeout)."""

from __future__ import annotations

import time
from typing import Any


class ClockSpy:
    """``monkeypatch.setattr(module, "time", ClockSpy())``; the rest of ``time`` passes."""

    def __init__(self) -> None:
        self.readings: list[float] = []

    def monotonic(self) -> float:
        self.readings.append(time.monotonic())
        return self.readings[-1]

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def since_first(self) -> list[float]:
        """Every reading after the first (the one a deadline is set from), in seconds
        after it."""
        first, *later = self.readings
        return [reading - first for reading in later]
