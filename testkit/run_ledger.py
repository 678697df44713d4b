"""The memory ledger directory of one test run (aisafety/memory_ledger.py)."""

from __future__ import annotations

import os
import tempfile


def run_ledger() -> str:
    """One ledger per test run, shared by its xdist workers and subprocesses, so another run's
    claims on a shared machine do not change this one's budgets; the run removes it at its
    end (tests/conftest.py), else one directory per run piles up in the temporary folder."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or os.getpid()
    return os.path.join(tempfile.gettempdir(), f"aisafety-memory-test-{run}")
