"""``aisafety check``: a release gate for CI. Evaluate a plan on the candidate model (or
reuse the stored run of the same plan, model and data), compare it sample by sample with a
baseline run or model, check the absolute requirements, and exit 0 (pass), 1 (a regression
or an unmet requirement) or 2 (a usage error, a non-comparable baseline included).
The statistics live in ``aisafety/report/gate/``; docs/release-gate.md explains them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from aisafety.errors import ConfigError
from aisafety.store import DEFAULT_URL

if TYPE_CHECKING:  # torch, SQLAlchemy and the plugins load inside the command (cli/)
    from aisafety.interfaces import EvaluationPlan
    from aisafety.report.gate.measures import GateRun
    from aisafety.report.gate.spec import GateSpec
    from aisafety.report.gate.verdicts import Verdict
    from aisafety.store.results import ResultStore


def cmd_check(args: argparse.Namespace) -> int:
    from aisafety.config import load_plan
    from aisafety.report.gate.measures import load_gate_run
    from aisafety.report.gate.output import text_lines
    from aisafety.report.gate.verdicts import gate_passed, requirement_verdicts
    from aisafety.sanity import sanity_checks
    from aisafety.store.results import ResultStore

    spec = gate_spec(args)
    plan = load_plan(args.plan)
    if plan.seeds:
        raise ConfigError(f"{args.plan}: `seeds:` runs one plan per seed; give one seed to check")
    store = ResultStore(args.db)
    candidate_id, reused = evaluated_run(plan, store, args.quiet)
    candidate = load_gate_run(store, candidate_id)
    header = f"candidate run {candidate_id} ({_models(candidate)}{', reused' if reused else ''})"
    verdicts: list[Verdict] = []
    if spec.regression:
        found, against = compared_with_baseline(args, spec, plan, store, candidate)
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


def compared_with_baseline(
    args: argparse.Namespace,
    spec: GateSpec,
    plan: EvaluationPlan,
    store: ResultStore,
    candidate: GateRun,
) -> tuple[list[Verdict], str]:
    """The regression verdicts against ``--baseline``, and the baseline said in words."""
    from aisafety.report.gate.comparable import check_comparable
    from aisafety.report.gate.measures import load_gate_run
    from aisafety.report.gate.verdicts import regression_verdicts

    if args.baseline is None:
        raise ConfigError(
            "--baseline RUN_ID_OR_MODEL is needed to compare with (or set "
            "'regression: false' in the --require file to check only its requirements)"
        )
    baseline_id, how = baseline_run(args.baseline, plan, store, args.quiet)
    baseline = load_gate_run(store, baseline_id)
    check_comparable(baseline, candidate)
    if baseline_id == candidate.run_id:
        how += "; the candidate run itself, so nothing can regress"
    return (
        regression_verdicts(baseline.measures, candidate.measures, spec),
        f"baseline run {baseline_id} ({_models(baseline)}, {how})",
    )


def gate_spec(args: argparse.Namespace) -> GateSpec:
    """The requirement file's settings (or the defaults), with --level/--min-effect over them."""
    from aisafety.report.gate.spec import GateSpec, gate_spec_from, load_gate_spec

    spec = load_gate_spec(args.require) if args.require else GateSpec()
    updates = {"level": args.level, "min_effect": args.min_effect}
    given = {k: v for k, v in updates.items() if v is not None}
    return gate_spec_from({**spec.model_dump(), **given}, "--level/--min-effect with --require")


def shown(url: str) -> str:
    """The database URL without its password: the header goes into PR comments and CI logs."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def evaluated_run(plan: EvaluationPlan, store: ResultStore, quiet: bool) -> tuple[int, bool]:
    """(the run of ``plan``, whether it was stored before): a finished run that holds every
    unit of the plan (same plan, model weights, data and seed: the units' keys) is reused."""
    from aisafety.execution import run_plan
    from aisafety.runner import Runner

    runner = Runner(plan, store, quiet=quiet)
    keys = [u.key for u in runner.work_units(runner.prepare().subject)]
    stored = stored_run(store, keys)
    if stored is not None:
        return stored, True
    return run_plan(plan, store, quiet=quiet).run_id, False


def stored_run(store: ResultStore, keys: list[str]) -> int | None:
    """The finished run whose complete rows hold every one of ``keys``, if one does."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from aisafety.store import schema

    finished = store.finished_units()
    if not keys or not set(keys) <= finished:
        return None
    with Session(store.engine) as session:
        run_ids = set(session.scalars(select(schema.Unit.run_id).where(schema.Unit.key.in_(keys))))
        if len(run_ids) != 1:
            return None
        run = session.get(schema.Run, run_ids.pop())
        return run.id if run is not None and run.status == "finished" else None


def baseline_run(
    baseline: str, plan: EvaluationPlan, store: ResultStore, quiet: bool
) -> tuple[int, str]:
    """A run id as given, or the zoo model's run of the candidate's plan (evaluated or
    reused); and how it was found, said for the output."""
    from sqlalchemy.orm import Session

    from aisafety.database.zoo import list_models
    from aisafety.interfaces import ModelSpec
    from aisafety.store import schema

    if baseline.isdigit():
        with Session(store.engine) as session:
            run = session.get(schema.Run, int(baseline))
            if run is None or run.status != "finished":
                state = "not in the database" if run is None else f"{run.status}, not finished"
                raise ConfigError(
                    f"--baseline {baseline}: run {baseline} is {state} ({store.url}); give a "
                    "finished run id (`aisafety query 'SELECT id, status FROM runs'`) or a zoo "
                    "model"
                )
        return int(baseline), "stored run"
    known = list_models()
    if baseline not in known:
        raise ConfigError(
            f"--baseline {baseline!r} is neither a run id nor a zoo model "
            "(`aisafety zoo list` names them)"
        )
    base_plan = plan.model_copy(update={"model": ModelSpec(name=baseline), "defenses": ()})
    run_id, reused = evaluated_run(base_plan, store, quiet)
    return run_id, f"{'reused' if reused else 'evaluated'} with the candidate's plan"


def write_outputs(args, store: ResultStore, candidate: GateRun, verdicts, header: str) -> None:
    from aisafety.report.gate.output import junit_xml, markdown

    if args.junit:
        _write(args.junit, junit_xml(verdicts, header), "JUnit XML")
    if args.markdown:
        _write(args.markdown, markdown(verdicts, header), "Markdown summary")
    if args.report:
        _write(args.report, gate_report(store, candidate, verdicts, header), "HTML report")


def gate_report(store: ResultStore, candidate: GateRun, verdicts, header: str) -> str:
    """The candidate run's HTML report with the gate's verdicts as its first section."""
    from aisafety.report.gate.output import summary
    from aisafety.report_page import Report, page, render_sections
    from aisafety.sanity import sanity_checks

    data = candidate.data
    report = Report(data, sanity_checks(data))
    report.gate = {"verdicts": verdicts, "header": header, "summary": summary(verdicts)}
    rendered = render_sections(report)
    subtitle = f"{', '.join(data.model_names)}: {summary(verdicts)}"
    return page(f"AISafety check: run {data.run_id}", subtitle, rendered, report.plots)


def _write(path: str, text: str, what: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out} ({what})")


def _models(run: GateRun) -> str:
    return ", ".join(run.data.model_names) or "no model"


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
