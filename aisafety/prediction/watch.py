"""Which tensors a model holds, and whether one forward pass changed them or its input.

A model that writes into its input (``x.zero_()``) or into its own weights or buffers
(a BatchNorm left in training mode, a hand-written in-place update) gives numbers that
depend on what ran before: every later attack and metric would read the changed state.
PyTorch counts in-place writes per tensor (``_version``), so comparing the counters around
a forward pass costs a few microseconds and names the model at once; writes that bypass
the counters (``.data``) are caught by the run's content fingerprints
(``evaluation/integrity.py``).
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from aisafety.errors import ModelOutputError, TamperingError

_MAX_DEPTH = 4  # predictors wrap predictors (defenses); deeper nesting is not searched


def model_tensors(predictor: object) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the modules ``predictor`` holds, also through the
    predictors it wraps (``inner`` of a defense), keyed by a readable name."""
    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for prefix, module in _modules(predictor, "", 0, set()):
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                found[f"{prefix}{name}"] = tensor
    return found


def _modules(
    obj: object, prefix: str, depth: int, seen: set[int]
) -> Iterator[tuple[str, nn.Module]]:
    if depth > _MAX_DEPTH or id(obj) in seen:
        return
    seen.add(id(obj))
    for attribute, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
        if isinstance(value, nn.Module):
            if id(value) not in seen:
                seen.add(id(value))
                yield f"{prefix}{attribute}.", value
        elif hasattr(value, "_logits") and hasattr(value, "num_classes"):  # a wrapped predictor
            yield from _modules(value, f"{prefix}{attribute}.", depth + 1, seen)


def _version(tensor: torch.Tensor) -> int | None:
    return None if tensor.is_inference() else tensor._version


def versions(x: torch.Tensor, tensors: dict[str, torch.Tensor]) -> tuple:
    """The write counters of ``x`` and of the model's tensors, before a forward pass."""
    return _version(x), [_version(t) for t in tensors.values()]


def check_forward(
    name: str, x: torch.Tensor, tensors: dict[str, torch.Tensor], before: tuple
) -> None:
    """Raise ``TamperingError`` naming model ``name`` if its forward pass wrote into its
    input or into one of its weights or buffers."""
    input_before, state_before = before
    if input_before is not None and _version(x) != input_before:
        raise TamperingError(
            f"model {name!r} wrote into its input during a forward pass (an in-place operation "
            "on x); every later number would read the changed images, so nothing of this unit "
            "is stored. Fix the model: work on a copy (x = x.clone()) or use out-of-place ops"
        )
    changed = [
        n for (n, t), v in zip(tensors.items(), state_before, strict=True) if _version(t) != v
    ]
    if changed:
        raise TamperingError(
            f"model {name!r} changed its own weights or buffers during a forward pass "
            f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}); its outputs would "
            "depend on what ran before, so nothing of this unit is stored. Put the model in "
            "eval() mode (BatchNorm in training mode updates its running statistics) and "
            "remove in-place updates of its state"
        )


# A forward pass still running this long after its deadline is stuck in compiled code,
# where the SIGALRM's Python handler never gets to run (at least HANG_GRACE_S, else 10 %).
HANG_GRACE_S = 5.0
# "1": such a pass ends the process (exit 2); set by the command line and on Ray workers,
# which nothing else can end (store/interruption.py: end_process_on_hang). Unset: a
# library caller (a notebook) gets a warning on stderr only.
HANG_ENDS_PROCESS = "AISAFETY_END_PROCESS_ON_HANG"


class _HangWatch:
    """One daemon thread for the process, holding the deadline of every forward pass in
    flight: arming and disarming cost a lock, not a thread per forward. When a pass stays
    in flight past its deadline plus the grace, its message goes to stderr and, where
    ``HANG_ENDS_PROCESS`` is "1", the process ends with exit 2 (``os._exit``: the main thread
    is stuck, no handler of it can run)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._armed: dict[int, tuple[float, str, float]] = {}  # deadline, model, seconds
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._waiting_until = math.inf  # the deadline the thread sleeps until

    def arm(self, name: str, seconds: float, grace: float) -> int:
        with self._lock:
            token = next(self._tokens)
            self._armed[token] = (time.monotonic() + seconds + grace, name, seconds)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="aisafety-hang-watch")  # fmt: skip
                self._thread.start()
            if self._armed[token][0] < self._waiting_until:  # else: no wake-up per forward
                self._lock.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._lock:
            self._armed.pop(token, None)

    def _watch(self) -> None:
        while True:
            with self._lock:
                self._waiting_until = math.inf
                while not self._armed:
                    self._lock.wait()
                token, (deadline, name, seconds) = min(self._armed.items(), key=lambda i: i[1][0])
                left = deadline - time.monotonic()
                if left > 0:
                    self._waiting_until = deadline
                    self._lock.wait(left)
                    continue
                self._armed.pop(token)
            _report_hang(name, seconds)


def _report_hang(name: str, seconds: float) -> None:
    grace = _grace(seconds)
    message = (
        f"model {name!r} has not returned from a forward pass after {seconds + grace:g} s "
        f"(limits.forward_seconds = {seconds:g}, plus {grace:g} s), and its code cannot be "
        "interrupted (a call into compiled code that never returns)"
    )
    if os.environ.get(HANG_ENDS_PROCESS) != "1":
        sys.stderr.write(f"\nwarning: {message}; it is left running (only the command line "
                         "ends it)\n")  # fmt: skip
        sys.stderr.flush()
        return
    recorder = threading.Thread(target=_before_exit, args=(message,), daemon=True)
    recorder.start()
    recorder.join(BEFORE_EXIT_S)  # a database that does not answer does not keep us here
    sys.stderr.write(
        f"\nerror: {message}; the units finished before are stored and the run is marked "
        "failed: fix the model, then rerun with --resume; the process is ended (exit 2)\n"
    )
    sys.stderr.flush()
    os._exit(2)


# What must happen before a stuck process ends (the runner marks its run and the stuck
# unit failed), called from the watchdog thread with the message; at most BEFORE_EXIT_S.
_BEFORE_EXIT: list[Callable[[str], None]] = []
BEFORE_EXIT_S = 10.0


def _before_exit(message: str) -> None:
    for callback in list(_BEFORE_EXIT):
        try:
            callback(message)
        except Exception as exc:  # noqa: BLE001 - the process ends anyway; say why not marked
            sys.stderr.write(f"warning: could not record the stuck forward pass: {exc}\n")


@contextmanager
def before_exit_on_hang(callback: Callable[[str], None]) -> Iterator[None]:
    """Within the block, ``callback(message)`` runs before a stuck forward pass ends the
    process (from another thread: the stuck one runs nothing)."""
    _BEFORE_EXIT.append(callback)
    try:
        yield
    finally:
        _BEFORE_EXIT.remove(callback)


def _grace(seconds: float) -> float:
    return max(HANG_GRACE_S, 0.1 * seconds)


_HANG_WATCH = _HangWatch()
# a forked child has the object but not its thread: it starts its own on first use
os.register_at_fork(after_in_child=lambda: _HANG_WATCH.__init__())


@contextmanager
def forward_deadline(name: str, seconds: float | None) -> Iterator[None]:
    """A watchdog on one forward pass of model ``name``: after ``seconds`` a SIGALRM raises
    ``ModelOutputError`` in the forward's Python code (a ``while True`` or a ``sleep`` in the
    model), so the run ends naming the model instead of running forever. Only in the main
    thread, where signals are delivered, and never nested. A call into compiled code that
    never returns (a deadlock in an extension) cannot be interrupted from Python: the
    backstop (``_HangWatch``) reports it ``HANG_GRACE_S`` later and ends the process."""
    if seconds is None:
        yield
        return
    with hang_backstop(name, seconds), _alarm(name, seconds):
        yield


@contextmanager
def hang_backstop(name: str, seconds: float | None) -> Iterator[None]:
    """Only the backstop (``_HangWatch``) around a forward pass: a lock, a few microseconds,
    for the attacks' hot path (``Predictor.watched_logits``), where the SIGALRM's two
    system calls per pass would cost more than a small model's forward on a GPU."""
    if seconds is None:
        yield
        return
    token = _HANG_WATCH.arm(name, seconds, _grace(seconds))
    try:
        yield
    finally:
        _HANG_WATCH.disarm(token)


@contextmanager
def _alarm(name: str, seconds: float) -> Iterator[None]:
    """SIGALRM after ``seconds``: raises in the forward's Python code (main thread only)."""
    usable = (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )
    if not usable:
        yield
        return

    def expire(_signum: int, _frame: object) -> None:
        raise ModelOutputError(
            f"model {name!r} did not return from a forward pass within {seconds:g} s "
            f"(limits.forward_seconds); check the model's code for a loop that never ends, "
            f"or raise 'limits: {{forward_seconds: ...}}' if one batch really takes that long"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
