"""Progress over a whole plan: units done of the total and an estimate of the time left.

The estimate is throughput-based (time so far / units finished here x units left), so it
holds for units that run one after the other and for units that run in parallel on a
cluster alike. Printed to stderr, so piped output (``--format json``) stays clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``42s``."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class UnitProgress:
    """``units 3/12 done (1 failed, 2 from the database), ETA 1m20s`` after each unit."""

    def __init__(self, total: int, resumed: int = 0, where: str = "", stream: TextIO | None = None):
        self.total = total
        self.resumed = resumed  # taken from the database: not counted in the throughput
        self.done = 0
        self.failed = 0
        self.where = where
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()

    def unit_finished(self, description: str, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        print(self.line(description, failed), file=self.stream, flush=True)

    def eta(self) -> float | None:
        """Seconds left, from the rate of the units finished so far (None before the first)."""
        if self.done == 0:
            return None
        left = self.total - self.resumed - self.done
        return (time.monotonic() - self.started) / self.done * left

    def line(self, description: str, failed: bool = False) -> str:
        finished = self.resumed + self.done
        notes = [f"{self.failed} failed"] if self.failed else []
        if self.resumed:
            notes.append(f"{self.resumed} from the database")
        eta = self.eta()
        text = f"units {finished}/{self.total} done" + (f" ({', '.join(notes)})" if notes else "")
        text += f", elapsed {duration(time.monotonic() - self.started)}"
        if eta is not None and finished < self.total:
            text += f", ETA {duration(eta)}"
        return f"{text}{self.where}: {'FAILED ' if failed else ''}{description}"
