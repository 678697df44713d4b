"""Where the project's shared read-only data (``shared/data``, see its README) lies: beside
the checkout, one folder further up (a worktree or clone inside a folder of its own), or
inside the checkout (a machine that was handed the checkout with it). One copy for the tests
(tests/shared_data.py skips with ``absent``'s message) and the benches (``shared_data``
exits with it), so both look in the same places and say the same thing when it is not there."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = (
    ROOT.parent / "shared" / "data",
    ROOT.parents[1] / "shared" / "data",
    ROOT / "shared" / "data",
)


def located(name: str) -> Path | None:
    """``shared/data/<name>`` in the first place that has it, else None."""
    return next((place / name for place in PLACES if (place / name).is_dir()), None)


def absent(name: str) -> str:
    """Why ``name`` cannot be used: where it was looked for, how to provide it."""
    looked = " or ".join(str(place / name) for place in PLACES)
    return f"shared data {name!r} not found at {looked}: put shared/ beside the checkout"


def shared_data(name: str) -> Path:
    """``shared/data/<name>`` for a bench, or one ``error:`` line naming where it was looked
    for and exit status 2 (as ``aisafety`` ends on a usage error)."""
    folder = located(name)
    if folder is None:
        print(f"error: {absent(name)}", file=sys.stderr)
        raise SystemExit(2)
    return folder
