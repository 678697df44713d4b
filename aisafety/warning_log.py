"""The ``AISafetyWarning``\\ s a run raises, kept so that the store writes them with the run.

A warning that only reaches the terminal is gone with it: a user who reads the results later
(SQL, ``aisafety report``) never learns that the model sat at chance or that its outputs were
not repeatable. Inside ``keeping(log)`` every ``AISafetyWarning`` raised goes into ``log``
(identical ones once), whatever the warning filters say; what the terminal shows is left to
the filters in force when ``keeping`` began, as before: shown, raised or dropped as they say,
the default action showing a warning once per (text, category, line) and run.

Logs nest: a warning goes to the innermost log only, so a unit's warnings are the unit's and
the rest are the run's (docs/database.md, ``run_warnings``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aisafety.errors import AISafetyWarning


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


_LOGS: list[WarningLog] = []  # the logs keeping now, innermost last


@contextmanager
def keeping(log: WarningLog) -> Iterator[WarningLog]:
    """Keep every ``AISafetyWarning`` raised inside the block in ``log``."""
    if _LOGS:  # the hook is in place: this log takes what is raised inside it
        _LOGS.append(log)
        try:
            yield log
        finally:
            _LOGS.remove(log)
        return
    with warnings.catch_warnings():
        hook = _Hook(list(warnings.filters), warnings.showwarning)
        # every AISafetyWarning reaches the hook; the filters copied above decide its display
        warnings.simplefilter("always", AISafetyWarning)
        warnings.showwarning = hook
        _LOGS.append(log)
        try:
            yield log
        finally:
            _LOGS.remove(log)


class _Hook:
    """``warnings.showwarning`` while a log keeps: keeps the warning, then shows, raises or
    drops it as the earlier ``filters`` say (with a registry of its own: once per run)."""

    def __init__(self, filters: list[Any], show: Any) -> None:
        self.filters, self.show = filters, show
        self.registry: dict[Any, Any] = {}
        self.forwarding = False

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        if self.forwarding or not _LOGS or not issubclass(category, AISafetyWarning):
            self.show(message, category, filename, lineno, file, line)
            return
        _LOGS[-1].add(category, str(message))
        ours = warnings.filters
        warnings.filters, self.forwarding = self.filters, True
        try:
            warnings.warn_explicit(message, category, filename, lineno, registry=self.registry)
        finally:
            warnings.filters, self.forwarding = ours, False
