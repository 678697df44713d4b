"""What the report reads about the installed plugins: its sections, each metric's
description, category and unit, and each attack's default settings.

Asking the registry for them imports every plugin, torch included: about half of the CPU
time of ``aisafety report`` on a small run (docs/report.md). A user reading stored results
should not pay for torch, and a machine that only reports may not have it. Where only the
built-ins are installed, their shipped listing (``builtin_listing.json``, held to the live
registry by tests/test_startup.py) and the built-in sections answer; with a plugin installed
the registry does, as a plugin may add sections, metrics and attacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aisafety.plugins import Registry
    from aisafety.report.sections import ReportSection


@dataclass(frozen=True)
class Catalog:
    sections: list[type[ReportSection]]
    metrics: dict[str, dict[str, Any]]  # name -> description, category, unit
    attacks: dict[str, dict[str, Any]]  # name -> default settings

    def attack_defaults(self, attack: str) -> dict[str, Any]:
        """The attack's default settings; {} for an attack not installed here."""
        return self.attacks.get(attack, {})


def registry_catalog(registry: Registry) -> Catalog:
    """The catalog of ``registry``'s plugins."""
    sections = [registry.get("report_section", n) for n in registry.names("report_section")]
    metrics = {}
    for name in registry.names("metric"):
        cls = registry.get("metric", name)
        metrics[name] = {"description": cls.description, "category": cls.category,
                         "unit": getattr(cls, "unit", None)}  # fmt: skip
    return Catalog(sections, metrics, {n: _defaults(registry, n) for n in registry.names("attack")})


def _defaults(registry: Registry, attack: str) -> dict[str, Any]:
    try:
        return registry.get("attack", attack).Config().model_dump()
    except (TypeError, ValueError):  # a setting without a default
        return {}


def shipped_catalog() -> Catalog | None:
    """The built-ins' catalog from the shipped listing, where it is the whole answer (no
    plugin installed, the listing of this version); else None."""
    from aisafety import listing_cache

    metrics, attacks = listing_cache.shipped("metrics"), listing_cache.shipped("attacks")
    if metrics is None or attacks is None:
        return None
    from aisafety.report.builtin_sections import builtin_sections

    keys = ("description", "category", "unit")
    return Catalog(
        builtin_sections(),
        {e["name"]: {k: e.get(k) for k in keys} for e in metrics},
        {e["name"]: _listed_defaults(e.get("config", {})) for e in attacks},
    )


def _listed_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A listing's settings as ``Config().model_dump()`` gives them: that fails (so {}) when
    a setting has no default (listed as "required")."""
    return {} if "required" in config.values() else config


def default_catalog() -> Catalog:
    """The installed plugins' catalog: the shipped listing's, else the registry's."""
    catalog = shipped_catalog()
    if catalog is None:
        from aisafety.plugins import default_registry

        catalog = registry_catalog(default_registry())
    return catalog
