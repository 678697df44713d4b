"""``keeping(log)`` (aisafety/warning_log.py) keeps every ``AISafetyWarning`` raised inside
it, whatever the warning filters say, and leaves the terminal to them; logs nest; each
thread keeps into its own context's log."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from aisafety.attack import streams
from aisafety.errors import AISafetyWarning, GradientMaskingWarning
from aisafety.warning_log import KeptWarning, WarningLog, keeping


def test_the_filters_decide_what_is_printed_not_what_is_kept():
    log = WarningLog()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        warnings.filterwarnings("ignore", "hidden")
        with keeping(log):
            for _ in range(3):
                warnings.warn("repeated", AISafetyWarning, stacklevel=1)  # shown once: "default"
            warnings.warn("hidden", GradientMaskingWarning, stacklevel=1)
            warnings.warn("not ours", UserWarning, stacklevel=1)
    assert [str(w.message) for w in shown] == ["repeated", "not ours"]
    assert log.entries == [
        KeptWarning(None, AISafetyWarning, "repeated"),
        KeptWarning(None, GradientMaskingWarning, "hidden"),
    ]
    with warnings.catch_warnings(), pytest.raises(AISafetyWarning, match="raised"):
        warnings.simplefilter("error", AISafetyWarning)
        with keeping(log):
            warnings.warn("raised", AISafetyWarning, stacklevel=1)
    assert log.entries[-1].message == "raised"


def test_a_nested_log_takes_what_is_raised_inside_it():
    run, unit = WarningLog(), WarningLog("k")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kept all the same
        with keeping(run):
            warnings.warn("the run's", AISafetyWarning, stacklevel=1)
            with keeping(unit):
                warnings.warn("the unit's", AISafetyWarning, stacklevel=1)
    assert [w.message for w in run.entries] == ["the run's"]
    assert unit.entries == [KeptWarning("k", AISafetyWarning, "the unit's")]
    assert run.take() == run.entries and run.take() == []  # each written once


def test_two_threads_keep_only_their_own_warnings():
    """Each thread keeps into its own block's log, also after the other's block has ended
    (session 19's module-level stack gave a warning to whichever block was innermost, and
    the first block to end took the hook away from the other)."""
    logs = {"one": WarningLog("one"), "two": WarningLog("two")}
    inside, one_ended = threading.Barrier(2), threading.Event()

    def keep(name: str) -> None:
        with keeping(logs[name]):
            inside.wait(timeout=30)
            warnings.warn(f"{name}'s", AISafetyWarning, stacklevel=1)
            inside.wait(timeout=30)  # both raised, neither block ended yet
            if name == "two":
                assert one_ended.wait(timeout=30)
                warnings.warn("two's, after one's block ended", AISafetyWarning, stacklevel=1)
        if name == "one":
            one_ended.set()

    before = warnings.showwarning
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=keep, args=(name,)) for name in logs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert [w.message for w in logs["one"].entries] == ["one's"]
    assert [w.message for w in logs["two"].entries] == ["two's", "two's, after one's block ended"]
    assert sorted(str(w.message) for w in shown) == [
        "one's", "two's", "two's, after one's block ended"
    ]  # fmt: skip
    assert warnings.showwarning is before  # the last block to end put the hook away


def test_a_thread_without_a_block_keeps_nothing_and_shows_as_the_filters_say():
    log, raised = WarningLog(), threading.Event()

    def elsewhere() -> None:
        for _ in range(2):
            warnings.warn("a thread of its own", AISafetyWarning, stacklevel=1)
        raised.set()

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with keeping(log):
            thread = threading.Thread(target=elsewhere)  # a fresh context: no log
            thread.start()
            thread.join(timeout=30)
    assert raised.is_set() and log.entries == []
    assert [str(w.message) for w in shown] == ["a thread of its own"]  # "default": once


def test_a_warning_raised_in_an_attack_stream_worker_lands_in_the_units_log(monkeypatch):
    """``streams._Pool.direct`` spreads a large draw over a thread pool; each task runs in a
    copy of the unit's context, so what it warns is the unit's."""
    real_rand, threads = torch.rand, set()

    def warning_rand(*args, **kwargs):
        threads.add(threading.get_ident())
        warnings.warn("from a stream worker", AISafetyWarning, stacklevel=2)
        return real_rand(*args, **kwargs)

    monkeypatch.setattr(streams, "PARALLEL_DRAW", 1)  # every direct draw is spread
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "rand", warning_rand)
    run, unit = WarningLog(), WarningLog("unit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with keeping(run), keeping(unit):
            drawn = streams.SampleStreams(0, range(4)).rand((4, streams.BUFFER))
    assert drawn.shape == (4, streams.BUFFER)
    assert threading.get_ident() not in threads  # drawn in the pool's threads only
    assert unit.entries == [KeptWarning("unit", AISafetyWarning, "from a stream worker")]
    assert run.entries == []


def _raise_each(tag: str) -> None:
    for _ in range(2):  # one line each: "default" shows each once
        for text, category in (("a", AISafetyWarning), ("b", GradientMaskingWarning),
                               ("hidden", AISafetyWarning), ("c", UserWarning)):  # fmt: skip
            warnings.warn(f"{text} {tag}", category, stacklevel=1)


@pytest.mark.parametrize("action", ["default", "always", "once", "module", "ignore"])
def test_what_is_shown_is_what_python_shows_without_keeping(action):
    """The hook decides the display itself (it never swaps ``warnings.filters`` back, which
    another thread could meet): the same as Python's own decision, the reference."""

    def shown(keep: bool) -> tuple[list[str], list[KeptWarning]]:
        tag, log = f"{action} {keep}", WarningLog()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter(action)
            warnings.filterwarnings("ignore", "hidden")
            warnings.filterwarnings("always", category=GradientMaskingWarning)
            if keep:
                with keeping(log):
                    _raise_each(tag)
            else:
                _raise_each(tag)
        return [str(w.message).replace(tag, "") for w in caught], log.entries

    python, _ = shown(False)
    ours, kept = shown(True)
    assert ours == python
    assert [w.message.split()[0] for w in kept] == ["a", "b", "hidden"]  # each once, all kept
