"""How a plan asks for corruptions: the ``corruptions:`` section (``CorruptionsSpec`` in
``aisafety.interfaces``), read by the mce/rmce metrics. Corruptions are not attacks: the
older form, a corruption listed under ``attacks:``, is refused with this error."""

from __future__ import annotations

from aisafety.corruption.base import CORRUPTIONS
from aisafety.errors import ConfigError


def corruption_under_attacks(name: str) -> ConfigError | None:
    """The error for a corruption named under ``attacks:`` (None when ``name`` is no
    corruption): it names the ``corruptions:`` key and the metric that reads it."""
    if name not in CORRUPTIONS:
        return None
    return ConfigError(
        f"attack {name!r} is a corruption, not an attack: corruptions are no longer listed "
        f"under attacks: (their eps was ignored and no attack metric read them); list it "
        f"under the plan's corruptions: key (corruptions: {{names: [{name}]}}) and add the "
        "mce or rmce metric (docs/corruptions.md)"
    )
