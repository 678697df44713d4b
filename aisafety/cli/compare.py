"""``aisafety compare``: one plan over several zoo models, with rank correlations
between its metrics and per-sample tests against a baseline model."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from aisafety.cli import collector, common
from aisafety.cli.common import info_printer
from aisafety.errors import ConfigError
from aisafety.store import DEFAULT_URL

if TYPE_CHECKING:
    from aisafety.interfaces import EvaluationPlan


def add_parser(sub) -> None:
    cp = sub.add_parser(
        "compare", help="evaluate several models with one plan and rank-correlate its metrics"
    )
    cp.add_argument("config", nargs="?", help="YAML/TOML plan (its model is replaced)")
    cp.add_argument("--models", nargs="+", required=True, help="zoo model names")
    cp.add_argument("--baseline", help="model the per-sample tests compare with (default first)")
    cp.add_argument("--db", default=DEFAULT_URL, help=f"SQLAlchemy URL (default {DEFAULT_URL})")
    cp.add_argument("--resume", action="store_true", help="skip units already in the database")
    cp.add_argument("--quiet", action="store_true", help="no progress bars")
    cp.add_argument("--device", choices=["auto", "cpu", "cuda"])
    cp.add_argument("--limit", type=int, help="evaluate on at most N samples (as dataset.sampling)")
    cp.add_argument("--format", choices=["table", "csv", "json"], default="table")
    cp.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    """Evaluate several models with one plan; rank correlations between its metrics."""
    # as evaluate: no full collection while torch, the plugins and the plan load, then all
    # of it frozen (aisafety/cli/collector.py)
    with collector.starting(args.whole_process):
        plan, baseline = comparison_plan(args)
    with common.plugin_failures_printed(), common.shown_once_per_command():
        results = evaluate_models(plan, args)
    from aisafety.store.engine import shown_url

    tables, note = comparison_tables(results, args.models, baseline)
    title = f"{len(args.models)} models on {plan.dataset.name} (db {shown_url(args.db)})"
    print_comparison(tables, title, baseline, args.format)
    if note:
        print(f"\n{note}", file=sys.stdout if args.format == "table" else sys.stderr)
    return 0


def comparison_plan(args: argparse.Namespace) -> tuple[EvaluationPlan, str]:
    """The plan with the overrides and the baseline; the plugins loaded, their failures
    printed; every model checked before any work."""
    from aisafety.config import apply_overrides, default_plan, load_plan
    from aisafety.database.zoo import list_models

    plan = load_plan(args.config) if args.config else default_plan()
    plan = apply_overrides(plan, device=args.device, limit=args.limit)
    common.print_plugin_failures()
    if len(set(args.models)) < 2:
        raise ConfigError(f"compare needs at least two different models, got {args.models}")
    known = list_models()
    for name in args.models:  # before any work: a plan given after --models is read as one
        if name not in known:
            hint = (
                f"; {name!r} looks like a plan file: give it before --models"
                if name.endswith((".yaml", ".yml", ".toml"))
                else ""
            )
            raise ConfigError(
                f"--models: {name!r} is not a zoo model (`aisafety zoo list` names them){hint}"
            )
    baseline = args.baseline or args.models[0]
    if baseline not in args.models:
        raise ConfigError(f"--baseline {baseline!r} is not among --models {args.models}")
    return plan, baseline


def evaluate_models(plan: EvaluationPlan, args: argparse.Namespace) -> dict[str, list]:
    """Each model's stored values: the plan run (or resumed) with that model."""
    from aisafety.execution import run_plan
    from aisafety.interfaces import ModelSpec
    from aisafety.store.results import ResultStore

    store = ResultStore(args.db)
    results = {}
    for name in args.models:
        model_plan = plan.model_copy(update={"model": ModelSpec(name=name)})
        record = run_plan(model_plan, store, resume=args.resume, quiet=args.quiet)
        results[name] = list(record.values)
    return results


def comparison_tables(
    results: dict[str, list], models: list[str], baseline: str
) -> tuple[dict[str, tuple], str | None]:
    """The models' values, the rank correlations between the metrics and the per-sample
    tests against the baseline (the last two where defined), and why some correlation is
    not (or None)."""
    from aisafety.evaluation.ranking import (
        metric_columns,
        rank_correlations,
        rank_sum_tests,
        undefined_correlations,
    )

    columns = metric_columns(results)
    tables = {
        "models": (
            ["model", *(f"{c.name} ({c.direction.value})" for c in columns)],
            [[name, *(c.values.get(name) for c in columns)] for name in models],
        ),
    }  # fmt: skip
    correlations = rank_correlations(columns)
    if correlations:
        tables["rank_correlations"] = (
            ["metric A", "metric B", "models", "spearman", "spearman p", "kendall", "kendall p"],
            [(r.first, r.second, r.models, r.spearman, r.spearman_p, r.kendall, r.kendall_p)
             for r in correlations],
        )  # fmt: skip
    tests = rank_sum_tests(results, baseline)
    if tests:
        tables["rank_sum_tests"] = (
            ["metric", "model", "mean", f"{baseline} mean", "statistic", "p", "verdict"],
            [(t.metric, t.model, t.model_mean, t.baseline_mean, t.statistic, t.p_value,
              t.verdict) for t in tests],
        )  # fmt: skip
    return tables, undefined_correlations(columns)


def print_comparison(tables: dict, header: str, baseline: str, fmt: str) -> None:
    """A table: every part on stdout. JSON: one object of the parts on stdout. CSV (one
    table per file): the models table on stdout, the others as tables on stderr."""
    from aisafety.report.table import render

    if fmt == "json":
        print(header, file=sys.stderr)
        print(json.dumps({name: json.loads(render(*table, "json"))
                          for name, table in tables.items()}, indent=2))  # fmt: skip
        return
    titles = {
        "rank_correlations": "rank correlations across models (raw values; 'lower is better' "
        "metrics agree with accuracy when negative):",
        "rank_sum_tests": f"Wilcoxon rank-sum test per sample against {baseline} (+ better, "
        "- worse, = no difference at p 0.05):",
    }
    info_printer(fmt)(header)
    print(render(*tables["models"], fmt))
    for name, title in titles.items():
        if name in tables:
            stream = sys.stdout if fmt == "table" else sys.stderr
            print(f"\n{title}", file=stream)
            print(render(*tables[name], "table" if fmt == "csv" else fmt), file=stream)
