"""SIGTERM and SIGHUP end a run like Ctrl-C does, so its row says 'interrupted'.

``kill -9`` cannot be caught: such a run is found by the next run on the same host (its
process is gone) or, on any host, by its lease running out (``store/liveness.py``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


def _raise_interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise KeyboardInterrupt (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal already ignored (SIGHUP under nohup) stays ignored.
    chosen = [s for s in _SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, _raise_interrupt) for s in chosen}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
