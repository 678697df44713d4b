"""The project's shared read-only data (``shared/data``, see its README): found beside the
checkout or one folder further up (a worktree or clone inside a folder of its own), so a
test that needs it skips, naming where it looked, instead of passing without it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLACES = (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data")


def located(name: str) -> Path | None:
    """``shared/data/<name>`` in the first place that has it, else None (for a module-level
    skip mark or parametrisation; a test body calls ``shared_folder``)."""
    return next((place / name for place in PLACES if (place / name).is_dir()), None)


def absent(name: str) -> str:
    """The skip reason for a missing ``name``: where it was looked for, how to provide it."""
    looked = " or ".join(str(place / name) for place in PLACES)
    return f"shared data {name!r} not found at {looked}: put shared/ beside the checkout"


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
