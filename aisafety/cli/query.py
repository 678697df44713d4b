"""``aisafety query``: read-only SQL against the results database."""

from __future__ import annotations

import argparse
import sys

from aisafety.store import DEFAULT_URL, QUERY_MAX_ROWS, QUERY_TIMEOUT_S


def add_parser(sub) -> None:
    qu = sub.add_parser("query", help="run read-only SQL against the results database")
    qu.add_argument("sql")
    qu.add_argument("--db", default=DEFAULT_URL)
    qu.add_argument("--format", choices=["table", "csv", "json"], default="table")
    qu.add_argument(
        "--timeout", type=float, default=QUERY_TIMEOUT_S, metavar="S",
        help=f"stop the statement after S seconds (default {QUERY_TIMEOUT_S:g})",
    )  # fmt: skip
    qu.add_argument(
        "--max-rows", type=int, default=QUERY_MAX_ROWS, metavar="N",
        help=f"print at most N rows (default {QUERY_MAX_ROWS})",
    )  # fmt: skip
    qu.set_defaults(func=cmd_query)


def cmd_query(args: argparse.Namespace) -> int:
    from aisafety.report.streaming import write_rows
    from aisafety.store.read_only import (
        QueryLimits,
        read_only_engine,
        read_only_rows,
        superuser_warning,
    )

    engine = read_only_engine(args.db)
    limits = QueryLimits(timeout_s=args.timeout, max_rows=args.max_rows)
    with read_only_rows(engine, args.sql, limits) as rows:
        write_rows(rows.columns, rows, args.format, sys.stdout)
    if (warning := superuser_warning(engine)) is not None:
        print(f"warning: {warning}", file=sys.stderr)
    if rows.truncated:
        print(
            f"warning: output stopped at {args.max_rows} rows (--max-rows); give a larger "
            "--max-rows, or narrow the query (WHERE, LIMIT)",
            file=sys.stderr,
        )
    return 0
