"""The project's shared read-only data (``shared/data``, see its README): found beside the
checkout or one folder further up (a worktree or clone inside a folder of its own), so a
test that needs it skips, naming where it looked, instead of passing without it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLACES = (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data")
DATA = next((p for p in PLACES if p.is_dir()), PLACES[0])


def shared_folder(name: str) -> Path:
    """``shared/data/<name>``, or a skip saying where it was looked for and how to provide it."""
    folder = DATA / name
    if not folder.is_dir():
        looked = " or ".join(str(p / name) for p in PLACES)
        pytest.skip(f"shared data {name!r} not found at {looked}: put shared/ beside the checkout")
    return folder
