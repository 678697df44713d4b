"""The plugin manager and the registry of everything plugins provide.

Built-ins are registered first, then every entry point of the ``aisafety`` group. A plugin
that fails to import, or whose hook raises, is recorded with its traceback and skipped; the
others still load. A name provided twice keeps its first owner (built-ins come first) and the
clash is recorded as a failure naming both sources, shown by ``aisafety plugins`` and warned
about by the commands that run plans.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from aisafety import hookspecs
from aisafety.errors import PluginError, UnknownNameError

KINDS = {
    "attack": "aisafety_attacks",
    "defense": "aisafety_defenses",
    "metric": "aisafety_metrics",
    "dataset": "aisafety_datasets",
    "verifier": "aisafety_verifiers",
    "report_section": "aisafety_report_sections",
}
BUILTIN = "aisafety.builtin"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    origin: str
    provides: dict[str, list[str]]


@dataclass(frozen=True)
class PluginFailure:
    name: str
    origin: str
    error: str


@dataclass
class Registry:
    """Name -> class for each kind, with the plugin each came from."""

    classes: dict[str, dict[str, type]] = field(default_factory=lambda: {k: {} for k in KINDS})
    sources: dict[str, dict[str, str]] = field(default_factory=lambda: {k: {} for k in KINDS})
    plugins: list[PluginInfo] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)

    def get(self, kind: str, name: str) -> type:
        try:
            return self.classes[kind][name]
        except KeyError:
            raise UnknownNameError(kind, name, self.classes[kind]) from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.classes[kind])

    def create(self, kind: str, name: str, config: dict[str, Any] | None = None, *args: Any) -> Any:
        """Instantiate ``name`` with ``config`` (``args`` go first, e.g. a wrapped predictor)."""
        return self.get(kind, name)(*args, config)

    def add(self, kind: str, cls: type, source: str, origin: str = "") -> None:
        """Register ``cls``; a name taken already keeps its first owner (built-ins load
        first), and the clash is recorded as a failure of ``source`` instead of stopping
        every command."""
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {source!r} gives a {kind} class {cls!r} without a 'name'")
        if name in self.classes[kind]:
            self.failures.append(
                PluginFailure(
                    source,
                    origin or source,
                    f"{kind} {name!r} is registered twice: by {self.sources[kind][name]!r} and "
                    f"by {source!r}; {source!r}'s {kind} is skipped. Rename it or uninstall "
                    "one of them",
                )
            )
            return
        self.classes[kind][name] = cls
        self.sources[kind][name] = source


def _entry_point_plugins() -> list[tuple[str, str, ModuleType | None, str | None]]:
    """(name, origin, module or None, traceback or None) for each ``aisafety`` entry point."""
    found = []
    for ep in metadata.entry_points(group=hookspecs.PROJECT):
        dist = getattr(ep, "dist", None)
        origin = f"{dist.name} {dist.version}" if dist else ep.value
        try:
            found.append((ep.name, origin, ep.load(), None))
        except Exception:  # a broken plugin must not take the others down
            found.append((ep.name, origin, None, traceback.format_exc()))
    return found


def build_registry(extra_plugins: list[tuple[str, object]] = ()) -> Registry:
    """Load built-ins, entry points and ``extra_plugins`` (name, module) into a registry."""
    from aisafety import builtin

    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    registry = Registry()
    candidates = [(BUILTIN, "aisafety (built-in)", builtin, None), *_entry_point_plugins()]
    candidates += [(name, "registered in code", module, None) for name, module in extra_plugins]
    for name, origin, module, error in candidates:
        if module is None:
            registry.failures.append(PluginFailure(name, origin, error or "unknown error"))
            continue
        _register_one(manager, registry, name, origin, module)
    return registry


def _register_one(manager, registry: Registry, name: str, origin: str, module: object) -> None:
    """Register one plugin; a failing import, unknown hook or raising hook is recorded."""
    provides: dict[str, list[type]] = {}
    registered = False
    try:
        manager.register(module, name=name)
        registered = True
        manager.check_pending()  # a misspelt hook name (aisafety_atacks) is an error
        for kind, hook in KINDS.items():
            for impl in getattr(manager.hook, hook).get_hookimpls():
                if impl.plugin_name == name:
                    provides[kind] = list(impl.function() or [])
    except Exception:
        if registered:
            manager.unregister(module)
        registry.failures.append(PluginFailure(name, origin, traceback.format_exc()))
        return
    for kind, classes in provides.items():
        for cls in classes:
            registry.add(kind, cls, name, origin)
    names = {kind: [c.name for c in classes] for kind, classes in provides.items()}
    registry.plugins.append(PluginInfo(name, origin, names))


def warn_failures(registry: Registry) -> None:
    """One line per broken or clashing plugin on stderr (details: ``aisafety plugins``)."""
    for failure in registry.failures:
        last = failure.error.strip().splitlines()[-1] if failure.error.strip() else "?"
        print(
            f"warning: plugin {failure.name!r} ({failure.origin}): {last} "
            "(details: aisafety plugins)",
            file=sys.stderr,
        )


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The registry of the installed plugins, built once per process."""
    return build_registry()
