"""When the command that runs an evaluation started: the wall time a user waits for.

A run's own ``started_at`` is written once the model and data are loaded, so it leaves out
Python's start, importing torch and loading: on the quick start that is a third of the wait
(issue #36: 99.7 s of evaluation in a 167 s command). The command line marks its start here
while it runs
(the process's start time, read from the kernel, so the imports before ``main`` count) and
the store writes it on every run the command makes. A run started from Python
(``aisafety.evaluate`` in a notebook) has no command: nothing is marked, nothing is stored.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

_started: float | None = None


@contextmanager
def command_clock(whole_process: bool) -> Iterator[None]:
    """While the command line's ``main`` runs: its start is marked, for the runs it makes.
    ``whole_process``: the command is this process (the console script), so it began when
    the process did; otherwise (``main`` called from Python) when ``main`` was called."""
    global _started
    _started = process_start_time() if whole_process else time.time()
    try:
        yield
    finally:
        _started = None


def command_started_at() -> datetime | None:
    """The marked start as naive UTC (the store's convention), or None outside a command."""
    if _started is None:
        return None
    return datetime.fromtimestamp(_started, UTC).replace(tzinfo=None)


def process_start_time() -> float:
    """This process's start (seconds since the epoch): from /proc on Linux, else now.
    The age is the system's uptime less the process's start in ticks after boot (both to
    1/100 s; /proc/stat's boot time has whole seconds only)."""
    try:
        with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as f:
            # field 22 (starttime, clock ticks after boot); the command name in field 2 may
            # hold spaces, so count after its closing parenthesis
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        return now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()
