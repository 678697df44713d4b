"""Verifiers by name, from the plugin registry (hook ``aisafety_verifiers``)."""

from __future__ import annotations

from typing import Any

from aisafety.verification.base import Verifier


def make_verifier(name: str, config: dict[str, Any] | None = None) -> Verifier:
    """The registered verifier ``name`` with ``config``; unknown names list the known ones."""
    from aisafety.plugins import default_registry

    return default_registry().create("verifier", name, config)
