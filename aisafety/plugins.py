"""The plugin manager and the registry of everything plugins provide.

Built-ins are registered first, then every entry point of the ``aisafety`` group. A plugin
that fails to import, or whose hook raises, is recorded with its traceback and skipped; the
others still load. A name provided twice keeps its first owner (built-ins come first) and the
clash is recorded as a failure naming both sources, shown by ``aisafety plugins`` and warned
about by the commands that run plans.
"""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from aisafety import hookspecs
from aisafety.corruption.plan import corruption_under_attacks
from aisafety.database.zoo import ZooEntry, read_manifest, zoo_roots
from aisafety.defense.training.base import TrainingDefense
from aisafety.errors import ConfigError, PluginError, PluginLoadWarning, UnknownNameError
from aisafety.interfaces import Architecture, ModelEntry

KINDS = {
    "attack": "aisafety_attacks",
    "defense": "aisafety_defenses",
    "training_defense": "aisafety_training_defenses",
    "metric": "aisafety_metrics",
    "dataset": "aisafety_datasets",
    "verifier": "aisafety_verifiers",
    "report_section": "aisafety_report_sections",
    "architecture": "aisafety_architectures",
    "model": "aisafety_models",
}
# Kinds whose hooks return records (instances), not classes: the record type each must be.
RECORDS = {"architecture": Architecture, "model": ModelEntry}
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
            if kind == "defense" and name in self.classes["training_defense"]:
                raise ConfigError(
                    f"defense {name!r} is a training defense: it produces a model instead of "
                    f"wrapping one; train it with 'aisafety zoo train --defense {name}' and "
                    f"evaluate the zoo model it writes{shipped_models_of(name)}"
                ) from None
            if kind == "defense" and (entry := zoo_entries().get(name)) is not None:
                raise ConfigError(
                    f"{name!r} is a zoo model (trained with {entry.recipe.defense!r}), not an "
                    f"input defense: evaluate it as 'model: {{name: {name}}}', with "
                    "'reference_model:' the undefended model for what the defense costs; "
                    f"input defenses: {', '.join(self.names('defense'))}"
                ) from None
            if kind == "attack" and (error := corruption_under_attacks(name)) is not None:
                raise error from None
            label = kind.replace("_", " ")
            raise UnknownNameError(label, name, self.classes[kind]) from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.classes[kind])

    def create(self, kind: str, name: str, config: dict[str, Any] | None = None, *args: Any) -> Any:
        """Instantiate ``name`` with ``config`` (``args`` go first, e.g. a wrapped predictor).

        A class that builds other plugins by name (``builds_from_registry``, e.g. the transfer
        attack's inner attack) gets this registry as ``registry=``.
        """
        cls = self.get(kind, name)
        if getattr(cls, "builds_from_registry", False):
            return cls(*args, config, registry=self)
        return cls(*args, config)

    def add(self, kind: str, cls: type, source: str, origin: str = "") -> bool:
        """Register ``cls``; a name taken already keeps its first owner (built-ins load
        first). A clash, a class of the wrong base or one without a name, or a record of the
        wrong type, is recorded as a failure of ``source`` instead of stopping every command.
        True if registered."""
        label = kind.replace("_", " ")
        if kind in RECORDS and not isinstance(cls, RECORDS[kind]):
            record = RECORDS[kind].__name__
            problem = (
                f"{KINDS[kind]} of {source!r} returned {cls!r}, which is skipped; return "
                f"aisafety.plugin.{record} records"
            )
            self.failures.append(PluginFailure(source, origin or source, problem))
            return False
        name = getattr(cls, "name", None)
        problem = _misfiled_defense(kind, cls) or _wrong_base(kind, cls)
        if not problem and (not isinstance(name, str) or not name):
            problem = (
                f"plugin {source!r} gives a {label} class {cls!r} without a 'name', and it "
                "is skipped; give the class a 'name' string"
            )
        taken = [
            other
            for other in _SHARED_NAMESPACE.get(kind, (kind,))
            if isinstance(name, str) and name in self.classes[other]
        ]
        if taken and not problem:
            problem = (
                f"{label} {name!r} is registered twice: by {self.sources[taken[0]][name]!r} and "
                f"by {source!r}; {source!r}'s {label} is skipped. Rename it or uninstall "
                "one of them"
            )
        if problem:
            self.failures.append(PluginFailure(source, origin or source, problem))
            return False
        self.classes[kind][name] = cls
        self.sources[kind][name] = source
        return True


# Input and training defenses are listed together (``aisafety list defenses``): one namespace.
_SHARED_NAMESPACE = {
    "defense": ("defense", "training_defense"),
    "training_defense": ("defense", "training_defense"),
}


def _misfiled_defense(kind: str, cls: type) -> str | None:
    """Why ``cls`` is returned from the wrong defense hook, or None: a training defense
    answers ``aisafety_training_defenses``, an input defense ``aisafety_defenses``."""
    is_training = isinstance(cls, type) and issubclass(cls, TrainingDefense)
    if kind == "defense" and is_training:
        return (
            f"training defense {cls.name!r} is returned from aisafety_defenses and is skipped; "
            "return it from the aisafety_training_defenses hook instead"
        )
    if kind == "training_defense" and not is_training:
        return (
            f"{cls!r} is returned from aisafety_training_defenses, which takes TrainingDefense "
            "subclasses only, and is skipped; return input defenses from aisafety_defenses"
        )
    return None


def _wrong_base(kind: str, cls: type) -> str | None:
    """Why ``cls`` cannot be a ``kind``, or None: each hook takes subclasses of the base its
    return annotation names (``hookspecs.hook_bases``)."""
    hook = KINDS[kind]
    base = hookspecs.hook_bases().get(hook)
    if base is None or (isinstance(cls, type) and issubclass(cls, base)):
        return None
    return (
        f"{cls!r} is returned from {hook}, which takes {base.__name__} subclasses only "
        f"(from aisafety.plugin), and is skipped; subclass {base.__name__} or return it "
        "from the hook of its kind"
    )


def _entry_point_plugins() -> list[tuple[str, str, ModuleType | None, str | None]]:
    """(name, origin, module or None, traceback or None) for each ``aisafety`` entry point."""
    found = []
    for ep in metadata.entry_points(group=hookspecs.PROJECT):
        dist = getattr(ep, "dist", None)
        origin = f"{dist.name} {dist.version}" if dist else ep.value
        try:
            found.append((ep.name, origin, ep.load(), None))
        except KeyboardInterrupt:
            raise
        except BaseException:  # a broken plugin (even one calling sys.exit) must not take
            found.append((ep.name, origin, None, traceback.format_exc()))  # the others down
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
                    provides[kind] = _classes(kind, hook, impl.function())
    except KeyboardInterrupt:
        raise
    except BaseException:  # SystemExit or junk from a hook disables this plugin only
        if registered:
            manager.unregister(module)
        registry.failures.append(PluginFailure(name, origin, traceback.format_exc()))
        return
    names: dict[str, list[str]] = {}
    for kind, classes in provides.items():
        for cls in classes:
            if registry.add(kind, cls, name, origin):
                names.setdefault(kind, []).append(cls.name)
    registry.plugins.append(PluginInfo(name, origin, names))


def _classes(kind: str, hook: str, returned: object) -> list:
    """What a hook returned, checked for shape: a list of classes (of ``RECORDS`` records,
    for the kinds whose hooks return records). Junk (``[42, "not-a-class"]``) disables the
    plugin; a class of the wrong base or without a name is skipped by ``Registry.add``, which
    names it, while the plugin's other classes load."""
    what = f"aisafety.plugin.{RECORDS[kind].__name__} records" if kind in RECORDS else (
        f"{kind} classes"
    )  # fmt: skip
    if returned is None:
        return []
    if isinstance(returned, str | bytes) or not hasattr(returned, "__iter__"):
        raise PluginError(f"hook {hook} returned {returned!r}; return a list of {what}")
    items = list(returned)
    for item in items:
        shaped = isinstance(item, RECORDS[kind]) if kind in RECORDS else isinstance(item, type)
        if not shaped:
            raise PluginError(f"hook {hook} returned {item!r} among its {kind}s; return {what}")
    return items


def failure_messages(registry: Registry) -> list[str]:
    """One line per broken or clashing plugin: its name, origin and the last line of its
    error (details: ``aisafety plugins``)."""
    lines = []
    for failure in registry.failures:
        last = failure.error.strip().splitlines()[-1] if failure.error.strip() else "?"
        lines.append(
            f"plugin {failure.name!r} ({failure.origin}): {last} (details: aisafety plugins)"
        )
    return lines


def failure_warnings(registry: Registry) -> list[str]:
    """``failure_messages`` as the command line prints them on stderr."""
    return [f"warning: {line}" for line in failure_messages(registry)]


def warn_failures(registry: Registry) -> None:
    """Each failure as a ``PluginLoadWarning``: a run warns them, so that they are stored
    with it (``run_warnings``) and a reader of the run learns what it ran without."""
    for line in failure_messages(registry):
        warnings.warn(line, PluginLoadWarning, stacklevel=2)


def zoo_entries() -> dict[str, ZooEntry]:
    """Every zoo model by name (an earlier root wins, as when loading)."""
    entries: dict[str, ZooEntry] = {}
    for root in reversed(zoo_roots()):
        entries.update(read_manifest(root))
    return entries


def shipped_models_of(defense: str) -> str:
    """``; the zoo has models trained with it: ...`` (empty when it has none): a training
    defense named where a plan wraps a model is usually one the user meant to evaluate."""
    trained = [name for name, entry in zoo_entries().items() if entry.recipe.defense == defense]
    if not trained:
        return ""
    more = f" and {len(trained) - 3} more (aisafety list models)" if len(trained) > 3 else ""
    return (
        f"; the zoo has models trained with it: {', '.join(trained[:3])}{more}: evaluate "
        "one as 'model: {name: NAME}'"
    )


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The registry of the installed plugins, built once per process."""
    return build_registry()
