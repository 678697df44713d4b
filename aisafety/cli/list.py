"""``aisafety list KIND``: what is registered (served from the listing cache when
nothing changed since the last listing)."""

from __future__ import annotations

import argparse
import json

from aisafety.cli import collector, common
from aisafety.listing import LIST_KINDS


def add_parser(sub) -> None:
    ls = sub.add_parser("list", help="list what is registered")
    ls.add_argument("kind", choices=[*LIST_KINDS, "models"])
    ls.add_argument("--format", choices=["table", "json"], default="table")
    ls.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    """Served from aisafety/listing_cache.py when nothing changed since the last listing."""
    from aisafety import listing, listing_cache
    from aisafety.report.table import render

    entries = listing_cache.read(args.kind)
    if entries is None:
        # every plugin imported: as evaluate, no full collection while they load, then all
        # of it frozen (aisafety/cli/collector.py); a cached listing imports no torch
        with collector.starting(args.whole_process):
            registry = common.default_registry()
            common.print_plugin_failures()  # on stderr: what the listing lacks, and why
        entries, complete = listing.list_entries(args.kind, registry)
        if complete:
            listing_cache.write(args.kind, entries)
            listing.fill_listing_cache(args.kind, registry)
    if args.format == "json":
        print(json.dumps(entries, indent=2))
    else:
        columns = list(dict.fromkeys(c for e in entries for c in e)) or ["name"]
        rows = [[settings_text(e.get(c)) for c in columns] for e in entries]
        print(render(columns, rows))
    return 0


def settings_text(value: object) -> object:
    """A config dict as ``steps=10, rho=0.75`` in the table view."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return value
