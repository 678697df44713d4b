"""``aisafety evaluate``: run a plan, print its table, curve and sanity checks."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from aisafety.cli import collector, common
from aisafety.cli.common import info_printer
from aisafety.store import DEFAULT_URL

if TYPE_CHECKING:
    from aisafety.interfaces import EvaluationPlan
    from aisafety.store.results import ResultStore


def add_parser(sub) -> None:

    ev = sub.add_parser("evaluate", help="run an evaluation plan (default: the embedded demo)")
    ev.add_argument("config", nargs="?", help="YAML/TOML plan; omitted = the embedded default")
    ev.add_argument("--db", default=DEFAULT_URL, help=f"SQLAlchemy URL (default {DEFAULT_URL})")
    ev.add_argument("--resume", action="store_true", help="skip units already in the database")
    ev.add_argument("--quiet", action="store_true", help="no progress bars")
    ev.add_argument("--model", help="a zoo model in place of the plan's (aisafety list models)")
    ev.add_argument(
        "--dataset", help="a dataset in place of the plan's, same split and limit "
        "(aisafety list datasets)",
    )  # fmt: skip
    ev.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ev.add_argument("--limit", type=int, help="evaluate on at most N samples (as dataset.sampling)")
    ev.add_argument("--format", choices=["table", "csv", "json"], default="table")
    ev.add_argument(
        "--executor", choices=["local", "ray"],
        help="where the units run (default: the plan's executor, else local; docs/scale-out.md)",
    )  # fmt: skip
    ev.add_argument(
        "--address", help="Ray cluster: auto, host:6379 or ray://host:10001 (implies --executor "
        "ray unless given; default: a private Ray on this machine)",
    )  # fmt: skip
    ev.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    # no full collection while torch, the plugins and the plan load, then all of it frozen:
    # a third of a small plan's CPU time (aisafety/cli/collector.py)
    with collector.starting(args.whole_process):
        plan = load_plan_and_plugins(args)
    with common.plugin_failures_printed():  # printed once, not again by each run
        return evaluate_plan(plan, args)


def load_plan_and_plugins(args: argparse.Namespace) -> EvaluationPlan:
    """The plan with the command line's overrides; the plugins loaded, their failures printed."""
    from aisafety.config import apply_overrides, default_plan, load_plan

    plan = load_plan(args.config) if args.config else default_plan()
    plan = apply_overrides(
        plan,
        device=args.device,
        limit=args.limit,
        address=args.address,
        executor=args.executor or ("ray" if args.address else None),
        model=args.model,
        dataset=args.dataset,
    )
    common.print_plugin_failures()
    return plan


def evaluate_plan(plan: EvaluationPlan, args: argparse.Namespace) -> int:
    """Run the plan (once per seed with ``seeds``) and print its table, curve and checks."""
    from aisafety.execution import run_plan
    from aisafety.report.table import curve_rows, metric_rows, render
    from aisafety.store.engine import shown_url
    from aisafety.store.results import ResultStore

    store = ResultStore(args.db)
    if plan.seeds:
        return evaluate_seeds(plan, store, args)
    record = run_plan(plan, store, resume=args.resume, quiet=args.quiet)
    columns, rows = metric_rows(record.values)
    say = info_printer(args.format)
    where = f"run {record.run_id}, db {shown_url(args.db)}"
    say(f"model {model_label(plan)} on {plan.dataset.name}  ({where})")
    print(render(columns, rows, args.format))
    curve = curve_rows(record.values) if args.format == "table" else None
    if curve is not None:
        print("\nrobust accuracy against budget (eps 0: clean accuracy):")
        print(render(*curve))
    if record.resumed_units:
        say(f"({record.resumed_units} finished unit(s) taken from the database)")
    if args.format == "table":
        print_sanity_checks(store, record.run_id, args.quiet)
    return report_failures(record)


def report_failures(record) -> int:
    """Units that failed for good (Ray): named on stderr, exit 1, rerun with --resume."""
    if not record.failed_units:
        return 0
    print(
        f"\n{len(record.failed_units)} unit(s) failed after their retries (stored in "
        f"unit_failures of run {record.run_id}); rerun with --resume to compute only them:",
        file=sys.stderr,
    )
    for line in record.failed_units:
        print(f"  {line}", file=sys.stderr)
    return 1


def model_label(plan: EvaluationPlan) -> str:
    """The evaluated model as stored: with its input defenses and their settings."""
    from aisafety.interfaces import defended_name

    return defended_name(plan.model.name, plan.defenses)


def evaluate_seeds(plan, store: ResultStore, args: argparse.Namespace) -> int:
    """``seeds: [0, 1, 2]``: one run per seed, then each metric's mean +- std over them."""
    from aisafety.execution import run_plan
    from aisafety.report.table import render, seed_rows
    from aisafety.store.engine import shown_url

    records = [
        # each run is the plan at one seed (a plan giving seed beside seeds is refused)
        run_plan(plan.model_copy(update={"seed": seed, "seeds": None}), store,
                 resume=args.resume, quiet=args.quiet)
        for seed in plan.seeds
    ]  # fmt: skip
    run_ids = [r.run_id for r in records]
    info_printer(args.format)(
        f"model {model_label(plan)} on {plan.dataset.name}  (seeds {list(plan.seeds)}: runs "
        f"{', '.join(map(str, run_ids))}, db {shown_url(args.db)})"
    )
    per_seed = [(seed, r.values) for seed, r in zip(plan.seeds, records, strict=True)]
    columns, rows = seed_rows(per_seed)
    print(render(columns, rows, args.format))
    if args.format == "table":
        for run_id in run_ids:
            print_sanity_checks(store, run_id, args.quiet)
        ids = " ".join(map(str, run_ids))
        print(f"\nreport over the seeds: {report_command(store, f'--compare {ids}')}")
    return max(report_failures(r) for r in records)


def report_command(store: ResultStore, what: object) -> str:
    """``aisafety report WHAT`` with the ``--db`` the run went to (password masked): without
    it the command reads ./aisafety.db, which may hold another run of that id (a folder a
    team shares), or none (before session 21 the hint left it out)."""
    from aisafety.store.engine import shown_url

    db = "" if store.url == DEFAULT_URL else f" --db {shlex.quote(shown_url(store.url))}"
    return f"aisafety report {what}{db}"


def print_sanity_checks(store: ResultStore, run_id: int, quiet: bool = False) -> None:
    """The gradient-masking checklist of the run just stored (aisafety/sanity.py). Quiet:
    its counts and its warnings only; a passed or skipped check asks nothing of the user."""
    from aisafety.report.data import load_run
    from aisafety.sanity import sanity_checks, summary_line

    checks = sanity_checks(load_run(store, run_id))
    if not checks:
        return
    warned = [c for c in checks if c.status == "warn"]
    if quiet:
        counts = {s: sum(c.status == s for c in checks) for s in ("pass", "skip")}
        print(f"\nsanity checks: {len(warned)} warning(s), {counts['pass']} passed, "
              f"{counts['skip']} skipped (details: {report_command(store, run_id)})")  # fmt: skip
    else:
        details = report_command(store, run_id)
        print(f"\nsanity checks ({len(warned)} warning(s); details: {details}):")
    for check in warned if quiet else checks:
        print(summary_line(check))
