"""``aisafety plugins``: the loaded plugins, their origin, what each provides, and
the failures."""

from __future__ import annotations

import argparse
import textwrap

from aisafety.cli import collector, common

PROVIDES_WIDTH = 72  # `aisafety plugins` wraps what each plugin provides to this width


def add_parser(sub) -> None:
    pl = sub.add_parser("plugins", help="list loaded plugins, their origin and failures")
    pl.set_defaults(func=cmd_plugins)


def cmd_plugins(args: argparse.Namespace) -> int:
    from aisafety.report.table import render

    # every plugin imported: as evaluate, no full collection while they load, then all of
    # it frozen (aisafety/cli/collector.py)
    with collector.starting(args.whole_process):
        registry = common.default_registry()
    rows = []
    for plugin in registry.plugins:
        provides = "; ".join(f"{k}: {', '.join(v)}" for k, v in plugin.provides.items())
        lines = textwrap.wrap(provides, PROVIDES_WIDTH, break_on_hyphens=False) or [""]
        rows += [(plugin.name, plugin.origin, lines[0])]
        rows += [("", "", line) for line in lines[1:]]  # the built-ins provide ~100 names
    print(render(["plugin", "origin", "provides"], rows))
    for failure in registry.failures:
        print(f"\nplugin {failure.name!r} ({failure.origin}) failed to load:\n{failure.error}")
    return 1 if registry.failures else 0
