"""How a plan asks for corruptions: the ``corruptions:`` section (``CorruptionsSpec`` in
``aisafety.interfaces``), read by the mce/rmce metrics, and the deprecated older form."""

from __future__ import annotations

import warnings


def warn_corruption_as_attack(name: str) -> None:
    """A corruption listed under ``attacks:`` still runs (its ``eps`` is ignored), but no
    per-attack metric applies to it: the plan's ``corruptions:`` section with mce/rmce is
    the way to measure corruption robustness."""
    warnings.warn(
        f"attack {name!r} is a corruption: corruptions under attacks: are deprecated (eps is"
        " ignored and no per-attack metric applies); list it in the plan's corruptions:"
        f" section (names: [{name}]) and add the mce or rmce metric; docs/configuration.md",
        FutureWarning,
        stacklevel=3,
    )
