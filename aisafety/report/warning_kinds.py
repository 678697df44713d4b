"""Each stored warning's kind, and the badge that counts a run's warnings by kind.

A warning is stored with its class's name (``run_warnings.category``), and the kind is that
name in words (``ClassCountWarning``: "class count", ``PluginLoadWarning``: "plugin load"),
so a plugin's own ``AISafetyWarning`` subclass is named without a table here. The plain
``AISafetyWarning`` names no kind: "other" (so are the clean-pass checks' warnings of runs
stored before they had classes of their own, session 21; their text says what they are).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

UNNAMED = ("AISafetyWarning", "UserWarning", "Warning")  # classes that say no kind
OTHER = "other"
WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")  # "ClassCount" -> Class, Count


def kind(category: str) -> str:
    """The kind a stored class name says, in words: ``AtChanceWarning`` -> "at chance"."""
    if category in UNNAMED:
        return OTHER
    words = WORD.findall(category.removesuffix("Warning"))
    return " ".join(w if w.isupper() and len(w) > 1 else w.lower() for w in words) or OTHER


def counted(categories: Iterable[str], noun: str = "warning") -> str:
    """``"3 warnings: at chance (2), plugin load"``: the number, then each kind in the order
    first raised, with its count where it is more than one; "" for none."""
    kinds = Counter(kind(c) for c in categories)
    total = sum(kinds.values())
    if not total:
        return ""
    each = ", ".join(k if n == 1 else f"{k} ({n})" for k, n in kinds.items())
    return f"{total} {noun}{'' if total == 1 else 's'}: {each}"
