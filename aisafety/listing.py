"""What ``aisafety list KIND`` shows: one entry per registered plugin (or zoo model) with its
description and settings, and filling the listing cache (``listing_cache.py``) for every kind
once the plugins are imported anyway."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the plugins load torch: the caller hands their registry in
    from aisafety.plugins import Registry

# What ``aisafety list <what>`` shows: the registry kinds, in order.
LIST_KINDS = {
    "attacks": ("attack",),
    "defenses": ("defense", "training_defense"),
    "metrics": ("metric",),
    "datasets": ("dataset",),
    "verifiers": ("verifier",),
    "architectures": ("architecture",),
}


def list_entries(kind: str, registry: Registry) -> tuple[list[dict], bool]:
    """What ``aisafety list KIND`` shows, and whether every plugin loaded (only then cached)."""
    if kind == "models":
        from aisafety.database.zoo import list_models

        entries = [
            {
                "name": e.name,
                "architecture": e.architecture,
                "dataset": e.dataset,
                "defense": e.recipe.defense,
                "clean_accuracy": e.metrics.get("clean_accuracy"),
                "source": str(root),
            }
            for e, root in list_models().values()
        ]
        entries += [
            {"name": name, "source": registry.sources["model"][name],
             "description": registry.get("model", name).description}
            for name in registry.names("model")
            if name not in {e["name"] for e in entries}
        ]  # fmt: skip
        return entries, not registry.failures
    entries = []
    for registry_kind in LIST_KINDS[kind]:
        for name in registry.names(registry_kind):
            cls = registry.get(registry_kind, name)
            info = cls.describe() if hasattr(cls, "describe") else {"name": name}
            if registry_kind == "architecture":
                info.update(input_shape=list(cls.input_shape), num_classes=cls.num_classes)
            info.setdefault("description", getattr(cls, "description", ""))
            if "config" not in info and hasattr(cls, "Config"):
                info["config"] = config_defaults(cls.Config)
            entries.append({**info, "plugin": registry.sources[registry_kind][name]})
    return entries, not registry.failures


def config_defaults(config: type) -> dict:
    """Each setting of a plugin's pydantic Config with its default ("required" if none)."""
    defaults = {}
    for field_name, info in getattr(config, "model_fields", {}).items():
        value = "required" if info.is_required() else info.get_default(call_default_factory=True)
        defaults[field_name] = json.loads(json.dumps(value, default=str))
    return defaults


def fill_listing_cache(listed: str, registry: Registry) -> None:
    """Every other plugin kind cached too: their plugins are imported already (the costly
    part, torch), so each later ``aisafety list KIND`` answers from the cache at once."""
    from aisafety import listing_cache

    for kind in LIST_KINDS:
        if kind != listed and listing_cache.read(kind) is None:
            entries, complete = list_entries(kind, registry)
            if complete:
                listing_cache.write(kind, entries)


def write_shipped_listing(registry: Registry | None = None) -> None:
    """aisafety/builtin_listing.json, the first listing's answer (aisafety/listing_cache.py):
    ``python -c "from aisafety.listing import write_shipped_listing as w; w()"``."""
    from aisafety import listing_cache
    from aisafety.errors import ConfigError

    if not listing_cache.only_builtins():
        raise ConfigError("the shipped listing is of the built-ins: uninstall plugins first")
    if registry is None:
        from aisafety.plugins import default_registry

        registry = default_registry()
    listings = {}
    for kind in [*LIST_KINDS, "models"]:
        listings[kind], complete = list_entries(kind, registry)
        if not complete:
            raise ConfigError(f"a built-in failed to register while listing {kind}")
    listing_cache.write_shipped(listings)
