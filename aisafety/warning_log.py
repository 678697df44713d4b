"""The ``AISafetyWarning``\\ s a run raises, kept so that the store writes them with the run.

A warning that only reaches the terminal is gone with it: a user who reads the results later
(SQL, ``aisafety report``) never learns that the model sat at chance or that its outputs were
not repeatable. Inside ``keeping(log)`` every ``AISafetyWarning`` raised goes into ``log``
(identical ones once), whatever the warning filters say; what the terminal shows is left to
the filters in force when keeping began, as before: shown, raised or dropped as they say,
the default action showing a warning once per (text, category, line) and run.

Logs nest: a warning goes to the innermost log only, so a unit's warnings are the unit's and
the rest are the run's (docs/database.md, ``run_warnings``).

Threads. The log a warning goes to is a ``ContextVar`` (as ``scoped.py``'s hooks): each thread
keeps into its own context's innermost log, so two runs in two threads keep only their own,
and a thread started with a copy of the caller's context (``contextvars.copy_context().run``,
as ``attack/streams.py``'s pool does) keeps into the caller's log. A thread with no log of
its own keeps nothing (its warnings are shown as the filters say). What Python offers for
the rest is process-wide: ``warnings.filters`` and ``warnings.showwarning`` are module
globals, and ``warnings.catch_warnings`` saves and restores them without a lock (its docs:
not thread-safe). So one hook serves every thread: the first ``keeping`` block of the
process (any thread) puts it in place, through one ``catch_warnings``, and the last one to
end takes it away, under a lock. The display follows the filters in force when that first
block began, matched by the hook itself (``warnings.warn_explicit``'s rules), never by
swapping ``warnings.filters`` back, which another thread's warning could meet half-way and
lose. Filters a thread changes while the hook is in place do not change what is kept; a
``catch_warnings`` of its own that outlives every keeping block (not LIFO across threads)
can leave the hook behind, which then only shows warnings, as the filters it copied say.
Python 3.14's ``context_aware_warnings`` flag (on by default only in free-threaded builds)
makes the filters context-local, so the first block's "always" would not reach other
threads; not handled (checked on 3.11, where they are module globals).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from aisafety.errors import AISafetyWarning
from aisafety.scoped import scoped


@dataclass(frozen=True)
class KeptWarning:
    """One warning as stored: the unit it belongs to (None: the run), its class and text."""

    unit_key: str | None
    category: type[Warning]
    message: str


class WarningLog:
    """The distinct warnings of a run (``unit_key`` None) or of one unit, in raising order."""

    def __init__(self, unit_key: str | None = None) -> None:
        self.unit_key = unit_key
        self._kept: dict[KeptWarning, None] = {}  # insertion-ordered set
        self._taken = 0

    def add(self, category: type[Warning], message: str) -> None:
        self.keep(KeptWarning(self.unit_key, category, message))

    def keep(self, warning: KeptWarning) -> None:
        """Keep ``warning`` as it is (a failed unit's warnings, moved to its run's log)."""
        self._kept.setdefault(warning)

    @property
    def entries(self) -> list[KeptWarning]:
        return list(self._kept)

    def take(self) -> list[KeptWarning]:
        """The warnings kept since the last ``take``: each is written once."""
        new = self.entries[self._taken :]
        self._taken += len(new)
        return new

    def __contains__(self, warning: KeptWarning) -> bool:
        return warning in self._kept


@dataclass(frozen=True)
class _Frame:
    """One ``keeping`` block as its context sees it: its log, and what the display has shown
    (shared by the blocks nested in the outermost one: once per run)."""

    log: WarningLog
    shown: dict[tuple, object]


_CURRENT: ContextVar[_Frame | None] = ContextVar("aisafety_warning_log", default=None)


@contextmanager
def keeping(log: WarningLog) -> Iterator[WarningLog]:
    """Keep every ``AISafetyWarning`` raised inside the block, in this context, in ``log``."""
    outer = _CURRENT.get()
    frame = _Frame(log, {} if outer is None else outer.shown)
    _HOOK.enter()
    try:
        with scoped(_CURRENT, frame):
            yield log
    finally:
        _HOOK.leave()


class _Hook:
    """``warnings.showwarning`` while any block keeps: keeps an ``AISafetyWarning`` in the
    raising context's log, then shows, raises or drops it as the filters copied when the hook
    was put in place say."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.saved: warnings.catch_warnings | None = None
        self.filters: list[Any] = []
        self.show: Any = None
        self.shown: dict[tuple, object] = {}  # a thread's without a log: once per process

    def enter(self) -> None:
        with self.lock:
            if self.users == 0:
                self.saved = warnings.catch_warnings()
                self.saved.__enter__()
                self.filters, self.show = list(warnings.filters), warnings.showwarning
                # every AISafetyWarning reaches the hook; the filters copied decide its display
                warnings.simplefilter("always", AISafetyWarning)
                warnings.showwarning = self
            self.users += 1

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.saved is not None:
                self.saved.__exit__(None, None, None)
                self.saved = None

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        if not issubclass(category, AISafetyWarning):  # passed the filters already
            self.show(message, category, filename, lineno, file, line)
            return
        frame = _CURRENT.get()
        if frame is not None:
            frame.log.add(category, str(message))
        shown = self.shown if frame is None else frame.shown
        if _to_show(self.filters, shown, message, category, filename, lineno):
            self.show(message, category, filename, lineno, file, line)


def _to_show(filters: list[Any], shown: dict, message, category, filename, lineno) -> bool:
    """Whether ``filters`` show the warning, as ``warnings.warn_explicit`` decides (the
    module is the file name without ``.py``, as there); ``shown`` is the registry of what was
    shown already. An ``error`` action raises the warning."""
    text, module = str(message), filename or "<unknown>"
    module = module[:-3] if module.lower().endswith(".py") else module
    action = warnings.defaultaction
    for act, pattern, cat, mod, number in filters:
        if (
            (pattern is None or pattern.match(text))
            and issubclass(category, cat)
            and (mod is None or mod.match(module))
            and number in (0, lineno)
        ):
            action = act
            break
    if action == "ignore":
        return False
    if action == "error":
        raise message if isinstance(message, Warning) else category(message)
    key = {
        "default": (text, category, lineno),
        "module": (text, category, module),
        "once": (text, category),
    }.get(action)
    if key is None:  # always
        return True
    first = object()
    return shown.setdefault((action, *key), first) is first  # one thread shows it, once


_HOOK = _Hook()
