"""``aisafety report``: the HTML report of a run, or the comparison of several."""

from __future__ import annotations

import argparse
import sys

from aisafety.cli.common import write_output
from aisafety.errors import ConfigError
from aisafety.store import DEFAULT_URL


def add_parser(sub) -> None:
    rp = sub.add_parser("report", help="write the HTML report of a run (or a comparison)")
    rp.add_argument("run_id", nargs="?", type=int, help="run id (default: the latest run)")
    rp.add_argument("--latest", action="store_true", help="the latest run (the default)")
    rp.add_argument(
        "--compare", nargs="+", metavar="RUN",
        help="leaderboard of these run ids or model names (a model name: its latest run)",
    )  # fmt: skip
    rp.add_argument("-o", "--output", default="report.html", help="default report.html")
    rp.add_argument("--db", default=DEFAULT_URL, help=f"SQLAlchemy URL (default {DEFAULT_URL})")
    rp.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from aisafety.report.data import latest_run_id
    from aisafety.report_page import (
        build_comparison,
        build_report,
        resolve_runs,
        unfinished_runs,
    )
    from aisafety.store.results import ResultStore

    store = ResultStore(args.db, create=False)  # a mistyped --db must not make an empty one
    if args.compare:
        run_ids = resolve_runs(store, args.compare)
        html = build_comparison(store, run_ids)
    else:
        if args.run_id is not None and args.latest:
            raise ConfigError("give a RUN_ID or --latest, not both")
        run_ids = [args.run_id if args.run_id is not None else latest_run_id(store)]
        html = build_report(store, run_ids[0])
    out = write_output(args.output, html, "-o")
    what = f"runs {', '.join(map(str, run_ids))}" if args.compare else f"run {run_ids[0]}"
    print(f"wrote {out} ({what}, {len(html) / 1024:.0f} KiB)")
    if note := unfinished_runs(store, run_ids):
        print(f"warning: {note}", file=sys.stderr)
    return 0
