"""Verifiers by name, from the plugin registry (hook ``aisafety_verifiers``).

The registry is handed in by its caller (the metric that the registry builds, the CLI):
importing ``aisafety.plugins`` here would run upward and close the cycle
plugins -> builtin -> certified metrics -> plugins.
"""

from __future__ import annotations

from typing import Any, Protocol

from aisafety.errors import ConfigError
from aisafety.verification.base import Verifier


class PluginRegistry(Protocol):
    """What verification uses of ``aisafety.plugins.Registry``."""

    def get(self, kind: str, name: str) -> type: ...

    def create(self, kind: str, name: str, config: dict[str, Any] | None = None) -> Any: ...


def needs_registry(registry: PluginRegistry | None, what: str) -> PluginRegistry:
    """``registry``, or a clear error for code that built ``what`` without one."""
    if registry is None:
        raise ConfigError(
            f"{what!r} builds verifiers and attacks by name: create it through the plugin "
            f"registry, aisafety.plugins.default_registry().create('metric', {what!r}, config)"
        )
    return registry


def make_verifier(
    registry: PluginRegistry, name: str, config: dict[str, Any] | None = None
) -> Verifier:
    """The registered verifier ``name`` with ``config``; unknown names list the known ones."""
    return registry.create("verifier", name, config)
