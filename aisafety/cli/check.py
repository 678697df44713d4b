"""``aisafety check``: the release gate for CI (the gate itself: ``aisafety/check.py`` and
``aisafety/report/gate/``; docs/release-gate.md). Exit 0 (pass), 1 (a regression or an unmet
requirement) or 2 (a usage error, a non-comparable baseline included)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from aisafety.cli import collector, common
from aisafety.cli.common import write_output
from aisafety.errors import ConfigError
from aisafety.store import DEFAULT_URL

if TYPE_CHECKING:
    from aisafety.interfaces import EvaluationPlan
    from aisafety.report.gate.measures import GateRun
    from aisafety.report.gate.spec import GateSpec
    from aisafety.report.gate.verdicts import Verdict
    from aisafety.store.results import ResultStore


def add_parser(sub) -> None:
    """The ``check`` subcommand of the ``aisafety`` command line."""
    ck = sub.add_parser(
        "check", help="release gate: compare a plan's run with a baseline and requirements"
    )
    ck.add_argument("plan", help="YAML/TOML evaluation plan of the candidate model")
    ck.add_argument(
        "--baseline", metavar="RUN_ID_OR_MODEL",
        help="a stored run id, or a zoo model evaluated (or reused) with the same plan",
    )  # fmt: skip
    ck.add_argument("--db", default=DEFAULT_URL, help=f"SQLAlchemy URL (default {DEFAULT_URL})")
    ck.add_argument("--require", metavar="FILE", help="YAML/TOML requirements and settings")
    ck.add_argument("--level", type=float, help="false-alarm rate of the comparison (0.05)")
    ck.add_argument("--min-effect", type=float, help="accuracy drop always tolerated (0)")
    ck.add_argument("--junit", metavar="FILE", help="write JUnit XML (one case per requirement)")
    ck.add_argument("--markdown", metavar="FILE", help="write a Markdown summary (PR comment)")
    ck.add_argument("--report", metavar="FILE", help="write the candidate's HTML report")
    ck.add_argument("--quiet", action="store_true", help="no progress bars")
    ck.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    # as evaluate: no full collection while torch, the plugins and the plan load, then all
    # of it frozen (aisafety/cli/collector.py)
    with collector.starting(args.whole_process):
        spec, plan = gate_inputs(args)
    with common.plugin_failures_printed(), common.shown_once_per_command():
        return checked(args, spec, plan)


def gate_inputs(args: argparse.Namespace) -> tuple[GateSpec, EvaluationPlan]:
    """The requirements and the plan; the plugins loaded, their failures printed."""
    from aisafety.config import load_plan

    spec = gate_spec(args)
    plan = load_plan(args.plan)
    if plan.seeds:
        raise ConfigError(f"{args.plan}: `seeds:` runs one plan per seed; give one seed to check")
    common.print_plugin_failures()
    return spec, plan


def checked(args: argparse.Namespace, spec: GateSpec, plan: EvaluationPlan) -> int:
    """The candidate evaluated (or reused) and gated: 0 passed, 1 not."""
    from aisafety.check import (
        compared_with_baseline,
        evaluated_run,
        models_of,
        shown,
        stored_baseline,
    )
    from aisafety.report.gate.measures import load_gate_run
    from aisafety.report.gate.output import text_lines
    from aisafety.report.gate.verdicts import gate_passed, requirement_verdicts
    from aisafety.sanity import sanity_checks
    from aisafety.store.results import ResultStore

    store = ResultStore(args.db)
    if spec.regression and args.baseline and args.baseline.isdigit():
        stored_baseline(args.baseline, store)  # before the candidate can take its id
    candidate_id, reused = evaluated_run(plan, store, args.quiet)
    candidate = load_gate_run(store, candidate_id)
    header = f"candidate run {candidate_id} ({models_of(candidate)}{', reused' if reused else ''})"
    verdicts: list[Verdict] = []
    if spec.regression:
        found, against = compared_with_baseline(
            args.baseline, args.quiet, spec, plan, store, candidate
        )
        verdicts, header = found, f"{header} against {against}"
    checks = [c for c in sanity_checks(candidate.data) if c.status == "warn"]
    verdicts += requirement_verdicts(spec, candidate, [f"{c.check}: {c.detail}" for c in checks])
    if not verdicts:
        raise ConfigError(
            f"nothing to check: run {candidate_id} stored no per-sample outcome to compare "
            "(add attacks or a certified metric to the plan) and --require gives no requirement"
        )
    header += f"; level {spec.level:g}, minimum effect {spec.min_effect:g} (db {shown(args.db)})"
    print(header)
    print("\n".join(text_lines(verdicts)))
    write_outputs(args, store, candidate, verdicts, header)
    return 0 if gate_passed(verdicts) else 1


def gate_spec(args: argparse.Namespace) -> GateSpec:
    """The requirement file's settings (or the defaults), with --level/--min-effect over them."""
    from aisafety.report.gate.spec import GateSpec, gate_spec_from, load_gate_spec

    spec = load_gate_spec(args.require) if args.require else GateSpec()
    updates = {"level": args.level, "min_effect": args.min_effect}
    given = {k: v for k, v in updates.items() if v is not None}
    return gate_spec_from({**spec.model_dump(), **given}, "--level/--min-effect with --require")


def write_outputs(args, store: ResultStore, candidate: GateRun, verdicts, header: str) -> None:
    from aisafety.check import gate_report
    from aisafety.report.gate.output import junit_xml, markdown

    if args.junit:
        _write(args.junit, junit_xml(verdicts, header), "--junit", "JUnit XML")
    if args.markdown:
        _write(args.markdown, markdown(verdicts, header), "--markdown", "Markdown summary")
    if args.report:
        html = gate_report(store, candidate, verdicts, header)
        _write(args.report, html, "--report", "HTML report")


def _write(path: str, text: str, option: str, what: str) -> None:
    out = write_output(path, text, option)
    print(f"wrote {out} ({what})")
