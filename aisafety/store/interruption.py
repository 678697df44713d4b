"""SIGTERM and SIGHUP end a run like Ctrl-C does, so its row says 'interrupted'.

``kill -9`` cannot be caught: such a run is found by the next run on the same host (its
process is gone) or, on any host, by its lease running out (``store/liveness.py``).
Neither can a forward pass stuck in compiled code: within ``end_process_on_hang`` the
model's watchdog (``prediction/watch.py``) ends the process, found the same way.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


def _raise_interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


@contextmanager
def _handling(signals, handler) -> Iterator[None]:
    """Within the block, ``handler`` for each of ``signals`` that is not ignored (SIGHUP
    under nohup stays ignored), the previous handlers restored after; in a thread other
    than the main one (where Python cannot install handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    chosen = [s for s in signals if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, handler) for s in chosen}
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise KeyboardInterrupt (main thread only)."""
    with _handling(_SIGNALS, _raise_interrupt):
        yield


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM/SIGHUP are held and raised as KeyboardInterrupt
    when it ends (main thread only): for a step whose effect must be complete before an
    interruption can be handled, e.g. writing a run's row and starting its heartbeat, so
    that the handler finds a row to mark 'interrupted'."""
    held: list[int] = []
    with _handling((signal.SIGINT, *_SIGNALS), lambda signum, _frame: held.append(signum)):
        yield
    if held:
        raise KeyboardInterrupt(f"received {signal.Signals(held[0]).name}")


# Read by prediction/watch.py (which cannot import this layer): "1" lets its watchdog end
# the process when a forward pass is stuck past its deadline; unset, it only warns.
HANG_ENDS_PROCESS = "AISAFETY_END_PROCESS_ON_HANG"


@contextmanager
def end_process_on_hang() -> Iterator[None]:
    """Within the block, a forward pass stuck past ``limits.forward_seconds`` (plus a grace)
    ends the process with exit 2: for the command line, which nothing else would end. A
    library caller (a notebook) keeps its process and gets a warning."""
    before = os.environ.get(HANG_ENDS_PROCESS)
    os.environ[HANG_ENDS_PROCESS] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HANG_ENDS_PROCESS, None)
        else:
            os.environ[HANG_ENDS_PROCESS] = before
