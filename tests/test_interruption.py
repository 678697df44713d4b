"""The two signal blocks of ``store/interruption.py``, in-process: what each installs, that
an ignored signal stays ignored, that the previous handlers come back, and that another
thread changes nothing (the runs' end to end behaviour: tests/test_early_signals.py)."""

from __future__ import annotations

import signal
import threading

import pytest

from aisafety.store.interruption import interrupts_deferred, terminate_as_interrupt


@pytest.fixture
def own_handlers():
    """SIGTERM and SIGINT with a handler of the test's, SIGHUP ignored; all put back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    seen: list[int] = []
    mine = lambda signum, _frame: seen.append(signum)  # noqa: E731
    signal.signal(signal.SIGTERM, mine)
    signal.signal(signal.SIGINT, mine)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    yield mine, seen
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_sigterm_raises_inside_and_the_handlers_come_back(own_handlers):
    mine, seen = own_handlers
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), terminate_as_interrupt():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # nohup's stays
        assert signal.getsignal(signal.SIGINT) is mine  # Ctrl-C is Python's own
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is mine
    signal.raise_signal(signal.SIGTERM)
    assert seen == [signal.SIGTERM]


def test_a_deferred_signal_is_raised_when_the_block_ends(own_handlers):
    mine, seen = own_handlers
    done = []
    with pytest.raises(KeyboardInterrupt, match="SIGINT"), interrupts_deferred():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        done.append(True)  # the block ran to its end
    assert done and not seen  # held, not passed to the test's handler
    assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
    with interrupts_deferred():  # nothing received: nothing raised
        pass


def test_another_thread_changes_no_handler(own_handlers):
    mine, _ = own_handlers
    seen_there = []

    def body():
        with terminate_as_interrupt(), interrupts_deferred():
            seen_there.append(signal.getsignal(signal.SIGTERM))

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert seen_there == [mine]
