"""The aisafety command line: evaluate a classifier's robustness, store it, report it."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aisafety.check import add_parser as add_check_parser
from aisafety.command_clock import command_clock
from aisafety.database import DEFAULT_URL, QUERY_MAX_ROWS, QUERY_TIMEOUT_S
from aisafety.database.interruption import end_process_on_hang, terminate_as_interrupt
from aisafety.errors import AISafetyError, AISafetyWarning, ConfigError, UnknownNameError

if TYPE_CHECKING:
    from aisafety.database.store import ResultStore
    from aisafety.database.zoo import TrainingRecipe
    from aisafety.interfaces import EvaluationPlan

# Heavy modules (torch, SQLAlchemy, the plugins) are imported inside the commands that need
# them: `aisafety --help` and a cached `aisafety list` start in a fraction of a second
# (bench/startup.py; tests/test_startup.py keeps torch out of this module's imports).


def default_registry():
    """The installed plugins (imported on first use: registering them loads torch)."""
    from aisafety.plugins import default_registry as registry

    return registry()


PROVIDES_WIDTH = 72  # `aisafety plugins` wraps what each plugin provides to this width

# What ``aisafety list <what>`` shows: the registry kinds, in order.
LIST_KINDS = {
    "attacks": ("attack",),
    "defenses": ("defense", "training_defense"),
    "metrics": ("metric",),
    "datasets": ("dataset",),
    "verifiers": ("verifier",),
    "architectures": ("architecture",),
}


def cmd_evaluate(args: argparse.Namespace) -> int:
    from aisafety.config import default_plan, load_plan
    from aisafety.database.store import ResultStore
    from aisafety.execution import run_plan
    from aisafety.plugins import failure_warnings
    from aisafety.report.table import curve_rows, metric_rows, render

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
    for line in failure_warnings(default_registry()):
        print(line, file=sys.stderr)
    store = ResultStore(args.db)
    if plan.seeds:
        return evaluate_seeds(plan, store, args)
    record = run_plan(plan, store, resume=args.resume, quiet=args.quiet)
    columns, rows = metric_rows(record.values)
    say = info_printer(args.format)
    say(f"model {model_label(plan)} on {plan.dataset.name}  (run {record.run_id}, db {args.db})")
    print(render(columns, rows, args.format))
    curve = curve_rows(record.values) if args.format == "table" else None
    if curve is not None:
        print("\nrobust accuracy against budget (eps 0: clean accuracy):")
        print(render(*curve))
    if record.resumed_units:
        say(f"({record.resumed_units} finished unit(s) taken from the database)")
    if args.format == "table":
        print_sanity_checks(store, record.run_id)
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


def info_printer(fmt: str):
    """Where lines around the data go: stdout for a table (read by a person), stderr for
    csv/json, so that stdout redirected to a file is valid CSV or JSON."""
    stream = sys.stdout if fmt == "table" else sys.stderr
    return lambda line: print(line, file=stream)


def evaluate_seeds(plan, store: ResultStore, args: argparse.Namespace) -> int:
    """``seeds: [0, 1, 2]``: one run per seed, then each metric's mean +- std over them."""
    from aisafety.execution import run_plan
    from aisafety.report.table import render, seed_rows

    records = [
        # each run is the plan at one seed (a plan giving seed beside seeds is refused)
        run_plan(plan.model_copy(update={"seed": seed, "seeds": None}), store,
                 resume=args.resume, quiet=args.quiet)
        for seed in plan.seeds
    ]  # fmt: skip
    run_ids = [r.run_id for r in records]
    info_printer(args.format)(
        f"model {model_label(plan)} on {plan.dataset.name}  (seeds {list(plan.seeds)}: runs "
        f"{', '.join(map(str, run_ids))}, db {args.db})"
    )
    per_seed = [(seed, r.values) for seed, r in zip(plan.seeds, records, strict=True)]
    columns, rows = seed_rows(per_seed)
    print(render(columns, rows, args.format))
    if args.format == "table":
        for run_id in run_ids:
            print_sanity_checks(store, run_id)
        print(f"\nreport over the seeds: aisafety report --compare {' '.join(map(str, run_ids))}")
    return max(report_failures(r) for r in records)


def print_sanity_checks(store: ResultStore, run_id: int) -> None:
    """The gradient-masking checklist of the run just stored (aisafety/report/sanity.py)."""
    from aisafety.report.data import load_run
    from aisafety.report.sanity import sanity_checks, summary_line

    checks = sanity_checks(load_run(store, run_id))
    if checks:
        warned = sum(c.status == "warn" for c in checks)
        print(f"\nsanity checks ({warned} warning(s); details: aisafety report {run_id}):")
        print("\n".join(summary_line(c) for c in checks))


def cmd_report(args: argparse.Namespace) -> int:
    from aisafety.database.store import ResultStore
    from aisafety.report.data import latest_run_id
    from aisafety.report.html import build_comparison, build_report, resolve_runs

    store = ResultStore(args.db, create=False)  # a mistyped --db must not make an empty one
    if args.compare:
        run_ids = resolve_runs(store, args.compare)
        html = build_comparison(store, run_ids)
    else:
        if args.run_id is not None and args.latest:
            raise ConfigError("give a RUN_ID or --latest, not both")
        run_ids = [args.run_id if args.run_id is not None else latest_run_id(store)]
        html = build_report(store, run_ids[0])
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    what = f"runs {', '.join(map(str, run_ids))}" if args.compare else f"run {run_ids[0]}"
    print(f"wrote {out} ({what}, {len(html) / 1024:.0f} KiB)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Evaluate several models with one plan; rank correlations between its metrics."""
    from aisafety.config import default_plan, load_plan
    from aisafety.database.store import ResultStore
    from aisafety.database.zoo import list_models
    from aisafety.evaluation.ranking import (
        metric_columns,
        rank_correlations,
        rank_sum_tests,
        undefined_correlations,
    )
    from aisafety.execution import run_plan
    from aisafety.interfaces import ModelSpec
    from aisafety.plugins import failure_warnings

    plan = load_plan(args.config) if args.config else default_plan()
    plan = apply_overrides(plan, device=args.device, limit=args.limit)
    for line in failure_warnings(default_registry()):
        print(line, file=sys.stderr)
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
    store = ResultStore(args.db)
    results = {}
    for name in args.models:
        model_plan = plan.model_copy(update={"model": ModelSpec(name=name)})
        record = run_plan(model_plan, store, resume=args.resume, quiet=args.quiet)
        results[name] = list(record.values)
    columns = metric_columns(results)
    tables = {
        "models": (
            ["model", *(f"{c.name} ({c.direction.value})" for c in columns)],
            [[name, *(c.values.get(name) for c in columns)] for name in args.models],
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
    print_comparison(tables, f"{len(args.models)} models on {plan.dataset.name} (db {args.db})",
                     baseline, args.format)  # fmt: skip
    note = undefined_correlations(columns)
    if note:
        print(f"\n{note}", file=sys.stdout if args.format == "table" else sys.stderr)
    return 0


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


def apply_overrides(
    plan: EvaluationPlan,
    device: str | None,
    limit: int | None,
    executor: str | None = None,
    address: str | None = None,
    model: str | None = None,
    dataset: str | None = None,
) -> EvaluationPlan:
    """The plan with command-line options applied, validated like the plan file itself.
    ``model``: a zoo model in place of the plan's model (one model of a shared plan);
    ``dataset``: a registered dataset in place of the plan's, keeping its split, limit, seed
    and sampling."""
    from aisafety.config import plan_from_dict

    raw = plan.model_dump(mode="json", exclude_unset=True)
    if model is not None:
        raw["model"] = {"name": model}
    if dataset is not None:
        kept = ("split", "limit", "seed", "sampling")
        raw["dataset"] = {"name": dataset} | {
            k: v for k, v in raw.get("dataset", {}).items() if k in kept
        }
    if device is not None:
        raw["device"] = device
    if limit is not None:
        raw["dataset"] = {**raw.get("dataset", {}), "limit": limit}
    if executor is not None:
        raw["executor"] = {**raw.get("executor", {}), "name": executor}
    if address is not None:
        raw["executor"] = {**raw.get("executor", {}), "address": address}
    return plan_from_dict(
        raw,
        "the plan with the command-line options (--model, --dataset, --device, --limit, "
        "--executor, --address)",
    )


def cmd_list(args: argparse.Namespace) -> int:
    """Served from aisafety/listing_cache.py when nothing changed since the last listing."""
    from aisafety import listing_cache
    from aisafety.report.table import render

    entries = listing_cache.read(args.kind)
    if entries is None:
        entries, complete = list_entries(args.kind)
        if complete:
            listing_cache.write(args.kind, entries)
            fill_listing_cache(args.kind)
    if args.format == "json":
        print(json.dumps(entries, indent=2))
    else:
        columns = list(dict.fromkeys(c for e in entries for c in e)) or ["name"]
        rows = [[settings_text(e.get(c)) for c in columns] for e in entries]
        print(render(columns, rows))
    return 0


def fill_listing_cache(listed: str) -> None:
    """Every other plugin kind cached too: their plugins are imported already (the costly
    part, torch), so each later ``aisafety list KIND`` answers from the cache at once."""
    from aisafety import listing_cache

    for kind in LIST_KINDS:
        if kind != listed and listing_cache.read(kind) is None:
            entries, complete = list_entries(kind)
            if complete:
                listing_cache.write(kind, entries)


def write_shipped_listing() -> None:
    """aisafety/builtin_listing.json, the first listing's answer (aisafety/listing_cache.py):
    ``python -c "from aisafety.cli import write_shipped_listing as w; w()"``."""
    from aisafety import listing_cache

    if not listing_cache.only_builtins():
        raise ConfigError("the shipped listing is of the built-ins: uninstall plugins first")
    listings = {}
    for kind in [*LIST_KINDS, "models"]:
        listings[kind], complete = list_entries(kind)
        if not complete:
            raise ConfigError(f"a built-in failed to register while listing {kind}")
    listing_cache.write_shipped(listings)


def list_entries(kind: str) -> tuple[list[dict], bool]:
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
        registry = default_registry()
        entries += [
            {"name": name, "source": registry.sources["model"][name],
             "description": registry.get("model", name).description}
            for name in registry.names("model")
            if name not in {e["name"] for e in entries}
        ]  # fmt: skip
        return entries, not registry.failures
    registry = default_registry()
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


def settings_text(value: object) -> object:
    """A config dict as ``steps=10, rho=0.75`` in the table view."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return value


def cmd_verify(args: argparse.Namespace) -> int:
    from aisafety.verification.vnncomp import verify_report

    print(verify_report(default_registry(), args.network, args.spec, args.verifier, args.timeout))
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from aisafety.report.table import render

    registry = default_registry()
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


def cmd_query(args: argparse.Namespace) -> int:
    from aisafety.database.read_only import (
        QueryLimits,
        read_only_engine,
        read_only_rows,
        superuser_warning,
    )
    from aisafety.report.streaming import write_rows

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


def cmd_zoo(args: argparse.Namespace) -> int:
    if args.zoo_command == "list":
        return cmd_list(argparse.Namespace(kind="models", format=args.format))
    from aisafety.database.zoo_build import train_zoo_entry
    from aisafety.interfaces import DatasetSpec
    from aisafety.loading import load_data

    recipe, robust_eps, certified_eps = zoo_recipe(args)
    registry = default_registry()
    train_set = load_data(
        DatasetSpec(name=recipe.dataset, path=args.data_dir, split="train"), registry
    )
    test_set = load_data(
        DatasetSpec(name=recipe.dataset, path=args.data_dir, split="test"), registry
    )
    name = args.name or args.recipe_of or "mnist-cnn"
    entry = train_zoo_entry(
        name, recipe, train_set, test_set, Path(args.out), args.quiet, robust_eps, certified_eps,
        zoo_robust_every(args),
    )  # fmt: skip
    measured = ", ".join(
        f"{key} {value:.4f}" for key, value in entry.metrics.items() if "accuracy" in key
    )
    print(
        f"trained {entry.name}: {measured} ({len(test_set)} test images; robustness on "
        f"{entry.metrics.get('robust_samples', 0):.0f}); wrote {Path(args.out) / entry.file} "
        f"(sha256 {entry.sha256[:12]}…)"
    )
    print(f"use it with: AISAFETY_ZOO_PATH={args.out} aisafety evaluate ...")
    return 0


def zoo_recipe(
    args: argparse.Namespace,
) -> tuple[TrainingRecipe, list[float] | None, list[float] | None]:
    """The recipe ``zoo train`` runs: ``--recipe-of``'s (a shipped entry's, to reproduce it)
    or the defaults, with every option given on the command line overriding it; and the
    robust and certified budgets (``--robust-eps`` / ``--certified-eps``, else the entry's
    recorded ones, else None: the training defaults)."""
    from aisafety.database.zoo import TrainingRecipe, list_models

    base, recorded = TrainingRecipe(), {}
    if args.recipe_of is not None:
        entries = list_models()
        if args.recipe_of not in entries:
            raise UnknownNameError("zoo model", args.recipe_of, sorted(entries))
        entry = entries[args.recipe_of][0]
        base = entry.recipe
        for kind in ("pgd40_robust", "ibp_certified"):
            prefix = f"{kind}_accuracy_eps"
            recorded[kind] = [
                float(key.removeprefix(prefix)) for key in entry.metrics if key.startswith(prefix)
            ]
    given = {
        field: getattr(args, field)
        for field in (
            "architecture",
            "dataset",
            "defense",
            "epochs",
            "batch_size",
            "lr",
            "seed",
            *SCHEDULE_OPTIONS,
        )  # fmt: skip
        if getattr(args, field) is not None
    }
    if args.defense_config is not None:
        given["defense_config"] = parse_json_option("--defense-config", args.defense_config)
    if args.init_from is not None:
        given |= {"init_from": args.init_from, "init_sha256": None}
    for field in ("mean", "std"):
        if getattr(args, field) is not None:
            given[field] = tuple(getattr(args, field))
    recipe = TrainingRecipe(**{**base.model_dump(), **given})
    robust = args.robust_eps if args.robust_eps is not None else recorded.get("pgd40_robust")
    certified = (
        args.certified_eps if args.certified_eps is not None else recorded.get("ibp_certified")
    )
    return recipe, robust, certified


# Recipe fields for the optimiser, schedule and kept epoch (``TrainingRecipe``): option, type,
# help. They reproduce trainings like the SoK's (SGD, step lr, best epoch on the test set).
SCHEDULE_OPTIONS: dict[str, tuple[type, str]] = {
    "optimizer": (str, "adam (default) or sgd"),
    "momentum": (float, "SGD momentum (default 0)"),
    "weight_decay": (float, "default 0"),
    "lr_schedule": (str, "one-cycle (default) or step: lr x --lr-decay every --lr-decay-every"),
    "lr_decay": (float, "the step schedule's factor (default 0.1)"),
    "lr_decay_every": (int, "the step schedule's period in epochs (default 10)"),
    "lr_decay_from": (int, "the step schedule counts periods from this epoch (0-based; default 0)"),
    "keep": (str, "last (default) or best-test: the epoch scoring best on the TEST set"),
}


def zoo_robust_every(args: argparse.Namespace) -> int:
    """``--robust-every``, else the value ``--recipe-of``'s entry was measured with, else 1."""
    if args.robust_every is not None:
        return args.robust_every
    if args.recipe_of is None:
        return 1
    from aisafety.database.zoo import list_models

    return int(list_models()[args.recipe_of][0].metrics.get("robust_every", 1))


def parse_json_option(option: str, text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        example = '{"eps": 0.3}'
        raise ConfigError(f"{option} is not JSON ({exc}); e.g. '{example}'") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from aisafety.loading import resolve_device
    from aisafety.prediction.server import open_model, parse_numbers, serve

    predictor = open_model(
        args.model,
        input_shape=parse_numbers(args.input_shape, "--input-shape", int),
        num_classes=args.num_classes,
        mean=parse_numbers(args.mean, "--mean"),
        std=parse_numbers(args.std, "--std"),
        device=resolve_device(args.device),
    )
    serve(
        predictor,
        args.host,
        args.port,
        args.name,
        max_batch_size=args.max_batch_size,
        verbose=not args.quiet,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aisafety", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

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

    add_check_parser(sub)  # aisafety/check.py: the release gate (docs/release-gate.md)

    ls = sub.add_parser("list", help="list what is registered")
    ls.add_argument("kind", choices=[*LIST_KINDS, "models"])
    ls.add_argument("--format", choices=["table", "json"], default="table")
    ls.set_defaults(func=cmd_list)

    pl = sub.add_parser("plugins", help="list loaded plugins, their origin and failures")
    pl.set_defaults(func=cmd_plugins)

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

    sv = sub.add_parser("serve", help="serve a model over the Open Inference Protocol v2 (REST)")
    sv.add_argument("model", help="zoo model name, .onnx file or TorchScript archive (.pt)")
    sv.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves the network")
    sv.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    sv.add_argument("--name", help="model name in the URL (default: the model's own name)")
    sv.add_argument("--input-shape", help="C,H,W; needed for TorchScript and flat ONNX inputs")
    sv.add_argument("--num-classes", type=int, help="default: read from the model")
    sv.add_argument("--mean", help="per-channel mean, comma-separated (normalisation)")
    sv.add_argument("--std", help="per-channel std, comma-separated")
    sv.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    sv.add_argument("--max-batch-size", type=int, default=1024)
    sv.add_argument("--quiet", action="store_true", help="do not log requests")
    sv.set_defaults(func=cmd_serve)

    vf = sub.add_parser("verify", help="verify a VNN-COMP instance: NET.onnx SPEC.vnnlib")
    vf.add_argument("network", help="ONNX network")
    vf.add_argument("spec", help="VNN-LIB property")
    vf.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    vf.add_argument("--verifier", default="complete", help="see `aisafety list verifiers`")
    vf.set_defaults(func=cmd_verify)

    zoo = sub.add_parser("zoo", help="train or list zoo models")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zl = zsub.add_parser("list")
    zl.add_argument("--format", choices=["table", "json"], default="table")
    zt = zsub.add_parser("train", help="train a zoo model from a dataset folder")
    zt.add_argument("--data-dir", required=True, help="folder of the dataset's files")
    zt.add_argument(
        "--recipe-of", metavar="ZOO_MODEL",
        help="start from this zoo entry's recipe (reproduce it); other options override it",
    )  # fmt: skip
    zt.add_argument("--dataset", help="default mnist")
    zt.add_argument("--name", help="entry name (default: --recipe-of's, else mnist-cnn)")
    zt.add_argument("--architecture", help="default mnist-cnn")
    zt.add_argument("--out", default="zoo", help="folder for checkpoint + manifest.json")
    zt.add_argument(
        "--defense", help="a training defense: aisafety list defenses (default standard)"
    )
    zt.add_argument("--defense-config", help='JSON settings, e.g. \'{"eps": 0.3, "steps": 10}\'')
    zt.add_argument("--epochs", type=int, help="default 3")
    zt.add_argument("--batch-size", type=int, help="default 128")
    zt.add_argument("--lr", type=float, help="default 1e-3 (Adam, one-cycle schedule)")
    zt.add_argument("--seed", type=int, help="default 0")
    for field, (kind, text) in SCHEDULE_OPTIONS.items():
        zt.add_argument(f"--{field.replace('_', '-')}", type=kind, help=text)
    zt.add_argument("--mean", type=float, nargs="+", help="per-channel input mean (MNIST's)")
    zt.add_argument("--std", type=float, nargs="+", help="per-channel input std (MNIST's)")
    zt.add_argument("--init-from", help="zoo model to fine-tune from (pinned by sha256)")
    zt.add_argument(
        "--robust-eps", type=float, nargs="*",
        help="l-inf budgets for PGD-40 robust accuracy on 1,000 test images (default: the "
        "training eps)",
    )  # fmt: skip
    zt.add_argument(
        "--certified-eps", type=float, nargs="*",
        help="l-inf budgets for IBP-certified accuracy on the same images (default: the "
        "training eps for ibp / crown-ibp, none otherwise)",
    )  # fmt: skip
    zt.add_argument(
        "--robust-every", type=int, metavar="K",
        help="measure robustness on every K-th of the 1,000 images only (costly defenses; "
        "default: --recipe-of's recorded value, else 1)",
    )  # fmt: skip
    zt.add_argument("--quiet", action="store_true")
    zoo.set_defaults(func=cmd_zoo)
    return parser


def format_warning(message, category, filename, lineno, line=None) -> str:
    """Our own warnings as one ``warning: ...`` line; others as Python prints them."""
    if issubclass(category, AISafetyWarning):
        return f"warning: {message}\n"
    return PYTHON_FORMAT_WARNING(message, category, filename, lineno, line)


PYTHON_FORMAT_WARNING = warnings.formatwarning


def main(argv: Sequence[str] | None = None) -> int:
    warnings.formatwarning = format_warning
    args = build_parser().parse_args(argv)
    try:
        # SIGTERM/SIGHUP from the first moment (loading a model can take a while): the
        # command ends as Ctrl-C does, 130 and 'interrupted', not killed with 143
        clock = command_clock(whole_process=argv is None)
        with terminate_as_interrupt(), clock, end_process_on_hang():
            return args.func(args)
    except AISafetyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: finished units are in the database; rerun with --resume", file=sys.stderr
        )
        return 130
    except Exception as exc:
        failed_in = getattr(exc, "failed_in", None)  # set by the runner on a plugin's crash
        if failed_in is None:
            raise
        print(
            f"error: {failed_in} raised {type(exc).__name__}: {exc} (a bug in it, or in the "
            "model; the run is marked failed, and the traceback is stored in unit_failures: "
            'aisafety query "SELECT error FROM unit_failures"; --resume computes the unit '
            "again)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
