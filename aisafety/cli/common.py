"""What several commands share: the registry (imported on first use) and where
informational lines go."""

from __future__ import annotations

import sys


def default_registry():
    """The installed plugins (imported on first use: registering them loads torch)."""
    from aisafety.plugins import default_registry as registry

    return registry()


def info_printer(fmt: str):
    """Where lines around the data go: stdout for a table (read by a person), stderr for
    csv/json, so that stdout redirected to a file is valid CSV or JSON."""
    stream = sys.stdout if fmt == "table" else sys.stderr
    return lambda line: print(line, file=stream)
