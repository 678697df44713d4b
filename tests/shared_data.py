"""The project's shared read-only data (``shared/data``, see its README) for the tests: a
test that needs it skips, naming where it looked, instead of passing without it. Where it is
looked for is testkit/shared_location.py, which the benches use too."""

from __future__ import annotations

from pathlib import Path

import pytest
from shared_location import PLACES, absent, located

__all__ = ["PLACES", "absent", "located", "relocated", "shared_folder"]


def shared_folder(name: str) -> Path:
    """``shared/data/<name>``, or a skip saying where it was looked for and how to provide it."""
    folder = located(name)
    if folder is None:
        pytest.skip(absent(name))
    return folder


def relocated(path: Path) -> Path:
    """A file an example plan names in shared data, where this checkout finds it. The plans
    name it relative to themselves for a checkout beside shared/ (``.../shared/data/<name>/
    ...``, asserted here, so an example stays right for its users); a clone one folder
    further down has the data one level up (a skip names both places when neither has it)."""
    parts = path.parts
    at = next(i for i in range(len(parts) - 1) if parts[i : i + 2] == ("shared", "data"))
    name, rest = parts[at + 2], parts[at + 3 :]
    assert path.resolve() == PLACES[0].joinpath(name, *rest).resolve(), path
    return shared_folder(name).joinpath(*rest)
