"""The results semantics version: which rules for counting made a run's stored numbers.

A change to the code that moves stored numbers for a reason that is not the model (a sample
counted otherwise, a rate computed otherwise) bumps ``CURRENT`` and adds a row to
``CHANGES``. Every run stores the version that made it (``runs.semantics_version``), so the
comparison page can say when two runs were counted by different rules, and ``--resume``
never reuses a unit counted by older rules. It is an explicit table, not a guess from the
package version: the package version does not change with each commit, and most commits
move no stored number.

Runs stored before the version was kept (NULL) read as ``UNRECORDED``: the version before
the first change listed here. That includes the runs made between version 2's change and
revision 0005, counted by version 2: nothing stored tells them apart (not the package
version, not a column; a per-sample row can prove only version 1), and the times say when,
not which code, so they are not read (docs/report.md, "Results semantics version").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    """What version ``version`` counts differently from the one before it."""

    version: int
    date: str  # when the change entered the code (UTC)
    name: str  # the code that made it, to look up
    moved: str  # the stored numbers it moves, and which way


CHANGES: tuple[Change, ...] = (
    Change(
        version=2,
        date="2026-11-28",
        name="attack/base.keep_clean_mistakes",
        moved=(
            "a clean mistake an attack's point made right is no longer counted robust: "
            "robust accuracy and the worst case over attacks can only fall, by at most "
            "the clean error, and the other rates read from attack outcomes (ASR, ...) "
            "move with them"
        ),
    ),
    Change(
        version=3,
        date="2026-11-28",
        name="evaluation/metrics/certified.attack_upper_bound",
        moved=(
            "certified-accuracy's attack_upper_bound counts a sample broken when the "
            "verifier's replayed counterexample breaks it, not only the attack: the upper "
            "bound can only fall (the attack's own figure is kept as attack_robust_accuracy)"
        ),
    ),
)
UNRECORDED = 1  # runs stored before the version was kept: before every change above
CURRENT = CHANGES[-1].version if CHANGES else UNRECORDED


def version_of(stored: int | None) -> int:
    """The version a run was counted by (NULL: stored before versions were kept)."""
    return UNRECORDED if stored is None else stored


def changes_between(a: int, b: int) -> list[Change]:
    """The changes that lie between versions ``a`` and ``b`` (either order)."""
    low, high = sorted((a, b))
    return [c for c in CHANGES if low < c.version <= high]


def shown(stored: int | None) -> str:
    """A run's version as every comparison prints it: NULL said to be unrecorded."""
    note = " (not recorded: stored before it was kept)" if stored is None else ""
    return f"{version_of(stored)}{note}"


def why_unlike(versions: Iterable[int]) -> str:
    """What comparing numbers counted by these versions does, naming each change between."""
    found = set(versions)
    changes = changes_between(min(found), max(found))
    listed = "; ".join(f"version {c.version} ({c.name}, {c.date}): {c.moved}" for c in changes)
    return (
        "the runs counted by different rules, so part of a difference is the code's, not the "
        f"model's: {listed}"
    )


def sides_shown(sides: Mapping[str, Collection[int | None]]) -> str:
    """Each side's versions: ``baseline 1 (not recorded: ...), candidate 2``."""
    return ", ".join(
        f"{side} {', '.join(sorted({shown(v) for v in stored})) or 'none'}"
        for side, stored in sides.items()
    )


def unlike(sides: Mapping[str, Collection[int | None]]) -> str | None:
    """One line naming each side's versions and why they do not compare, or None when every
    side was counted by the same versions: the release gate and ``store.compare`` say it so,
    the comparison page cell by cell (``shown``, ``why_unlike``)."""
    read = {side: {version_of(v) for v in stored} for side, stored in sides.items()}
    if len({frozenset(v) for v in read.values() if v}) < 2:
        return None
    everything = set().union(*read.values())
    return f"results semantics version: {sides_shown(sides)}: {why_unlike(everything)}"
