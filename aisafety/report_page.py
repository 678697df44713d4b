"""The HTML report of one run, and the comparison page (leaderboard) of several.

Jinja2 (autoescaping) lays out the page; every figure is a Matplotlib PNG embedded as a data
URI, so the file opens anywhere with no network, server or JavaScript. Sections come from
the plugin registry (``aisafety_report_sections``), built-ins and third parties alike; with
only the built-ins installed, from their shipped listing, without importing torch
(report_catalog.py).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from aisafety.errors import ConfigError
from aisafety.interfaces import NEURON_SHARE
from aisafety.report.comparability import differences
from aisafety.report.data import RunData, load_run
from aisafety.report.plots import Plot, Series, line_plot
from aisafety.report.sections import ReportSection, worst_case
from aisafety.report.warning_kinds import counted
from aisafety.report_catalog import Catalog, default_catalog, registry_catalog
from aisafety.sanity import Check, sanity_checks
from aisafety.store.engine import shown_url
from aisafety.store.results import ResultStore

if TYPE_CHECKING:
    from aisafety.plugins import Registry

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def environment() -> Environment:
    return Environment(
        loader=PackageLoader("aisafety.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


@dataclass
class Report:
    """What a section renders from: the run's data, its sanity checks and the expansion of
    each metric name it shows (``glossary``: name -> what it measures)."""

    data: RunData
    checks: list[Check]
    catalog: Catalog = field(default_factory=default_catalog)
    plots: int = 0
    glossary: dict[str, str] = field(default_factory=dict)
    # fraction metrics that are not a rate over samples (neuron coverage): no interval
    not_rates: set[str] = field(default_factory=set)

    def template(self, name: str, **context: Any) -> Markup:
        html = environment().get_template(name).render(metric=self.metric, **context)
        self.plots += html.count('<img class="plot"')
        return Markup(html)

    def metric(self, label: str) -> Markup:
        """``label`` (``ald(p=2)``) as an abbreviation whose title expands it, linked to its
        glossary entry; a name the glossary lacks is shown as it is."""
        name = label.split("(", 1)[0]
        if name not in self.glossary:
            return Markup.escape(label)
        return Markup(
            '<a class="metric" href="#glossary-{0}"><abbr class="metric" title="{1}">{2}</abbr></a>'
        ).format(name, self.glossary[name], label)

    def attack_defaults(self, attack: str) -> dict[str, Any]:
        """The registered attack's default settings (a plan's config lists only changes)."""
        return self.catalog.attack_defaults(attack)


@dataclass
class RenderedSection:
    name: str
    title: str
    html: Markup


def sections(catalog: Catalog) -> list[ReportSection]:
    return [cls() for cls in sorted(catalog.sections, key=lambda c: (c.order, c.name))]


def render_sections(report: Report) -> list[RenderedSection]:
    """Each section's HTML; a section that raises is shown as a failure, not a lost report."""
    out = []
    for section in sections(report.catalog):
        try:
            html = section.render(report)
        except Exception as exc:  # a third-party section must not take the report down
            log.exception("report section %r failed", section.name)
            html = Markup(
                environment()
                .from_string('<p class="warn">this section failed: {{ e }}</p>')
                .render(e=f"{type(exc).__name__}: {exc}")
            )
        if html:
            out.append(RenderedSection(section.name, section.title, Markup(html)))
    return out


def page(title: str, subtitle: str, rendered: list[RenderedSection], plots: int) -> str:
    return (
        environment()
        .get_template("base.html.j2")
        .render(title=title, subtitle=subtitle, sections=rendered, plot_count=plots)
    )


def glossary(names: list[str], catalog: Catalog) -> dict[str, str]:
    """Each metric name's expansion: its registered description (a plugin metric no longer
    installed keeps its bare name)."""
    return {
        n: catalog.metrics[n]["description"] for n in dict.fromkeys(names) if n in catalog.metrics
    }


def coverage_metrics(names: list[str], catalog: Catalog) -> set[str]:
    """The ``data``-category fraction metrics (neuron coverage: a share of neurons or of their
    sections, which a binomial interval over images does not describe)."""
    found = set()
    for name in set(names):
        info = catalog.metrics.get(name)  # None: not installed here
        if info is not None and info["category"] == "data" and info["unit"] == NEURON_SHARE:
            found.add(name)
    return found


def catalog_of(registry: Registry | None) -> Catalog:
    """``registry``'s catalog; None: the installed plugins' (no torch with only built-ins)."""
    return default_catalog() if registry is None else registry_catalog(registry)


def build_report(store: ResultStore, run_id: int, registry: Registry | None = None) -> str:
    """The self-contained HTML report of run ``run_id``."""
    catalog = catalog_of(registry)
    data = load_run(store, run_id)
    report = Report(data, sanity_checks(data, catalog.attack_defaults), catalog)
    report.glossary = glossary([m.name for m in data.metrics], catalog)
    report.not_rates = coverage_metrics([m.name for m in data.metrics], catalog)
    rendered = render_sections(report)
    models = ", ".join(data.model_names) or "no models"
    subtitle = (
        f"{models} on {', '.join(d['name'] for d in data.datasets) or 'no data'}; "
        f"aisafety {data.platform_version}, seed {data.seed}{unfinished_note([data])}"
    )
    return page(f"AISafety report: run {run_id}", subtitle, rendered, report.plots)


def unfinished_note(runs: list[RunData]) -> str:
    """'; run 3 running, not finished: ...' at the top of the page: the runs' numbers cover
    only the units they stored, so a verdict there may lack its larger budgets (a shared
    database's latest run may be someone's run still going). Before session 21 only the
    provenance table, at the page's end, said so (a comparison: only when statuses
    differed)."""
    text = unfinished_text({d.run_id: d.status for d in runs})
    return f"; {text}" if text else ""


def unfinished_text(statuses: dict[int, str]) -> str:
    """What the page's subtitle and ``aisafety report`` say of the runs not finished."""
    unfinished = [f"run {i} {status}" for i, status in statuses.items() if status != "finished"]
    if not unfinished:
        return ""
    return f"{', '.join(unfinished)}, not finished: the numbers cover only the units stored"


def unfinished_runs(store: ResultStore, run_ids: list[int]) -> str:
    """``unfinished_text`` of stored runs, read from their status."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from aisafety.store import schema

    query = select(schema.Run.id, schema.Run.status).where(schema.Run.id.in_(run_ids))
    with Session(store.engine) as session:
        statuses = {i: status for i, status in session.execute(query)}
    return unfinished_text({i: statuses[i] for i in run_ids if i in statuses})


# comparison --------------------------------------------------------------------------------


@dataclass
class Column:
    family: str
    label: str
    unit: str
    direction: str
    values: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    metric: str = ""  # the metric the label starts with (expanded on the page)


def _category(metric: str, catalog: Catalog) -> str:
    info = catalog.metrics.get(metric)
    return "other" if info is None else info["category"]  # None: a plugin no longer installed


def _columns(runs: list[RunData], catalog: Catalog) -> dict[tuple, Column]:
    columns: dict[tuple, Column] = {}
    # models evaluated on different data are never ranked in one column
    several = len({d["name"] for data in runs for d in data.datasets}) > 1
    for data in runs:
        for m in data.metrics:
            if m.value is None or math.isnan(m.value):
                continue
            key = (m.metric, m.attack, m.eps, m.dataset)
            label = m.metric + (f" | {m.attack}" if m.attack else "")
            label += f" @{m.eps:g}" if m.eps is not None else ""
            label += f" [{m.dataset}]" if several else ""
            column = columns.setdefault(
                key,
                Column(
                    _category(m.name, catalog), label, m.unit, m.direction, metric=m.metric
                ),  # fmt: skip
            )
            column.values[m.model].append(m.value)
        for model in data.model_names:
            dataset = data.datasets[0]["name"] if data.datasets else ""
            for (norm, eps), (acc, _) in worst_case_of(data, model).items():
                key = ("worst-case", norm, eps, dataset)
                column = columns.setdefault(
                    key,
                    Column(
                        "worst case over attacks",
                        f"robust accuracy {norm} @{eps:g}" + (f" [{dataset}]" if several else ""),
                        "fraction",
                        "higher",
                    ),
                )
                column.values[model].append(acc)
    return columns


_NO_CATALOG = Catalog([], {}, {})  # worst_case reads the data only


def worst_case_of(data: RunData, model: str) -> dict[tuple[str, float], tuple[float, int]]:
    return worst_case(Report(data, [], _NO_CATALOG), model)


def _ranks(values: dict[str, float], direction: str) -> dict[str, float]:
    """1 = best; ties share the better rank. Neutral metrics are not ranked."""
    sign = -1 if direction == "higher" else 1
    ordered = sorted(values.values(), key=lambda v: sign * v)
    return {model: 1 + ordered.index(v) for model, v in values.items()}


def shared_ranks(scores: list[Fraction | float]) -> list[int | None]:
    """Competition ranks of ``scores`` (lower is better): equal scores share the better
    rank (2.5, 2.5, 4 -> 1, 1, 3); an infinite score (nothing ranked) gets None."""
    return [None if s == math.inf else 1 + sum(o < s for o in scores) for s in scores]


def _mean_rank(ranks: list[int]) -> Fraction | float:
    """Exact (a Fraction): 2.5 from (2, 3) and from (3, 2) must compare equal to tie."""
    return Fraction(sum(ranks), len(ranks)) if ranks else math.inf


def _runs_cell(runs: list[RunData]) -> str:
    """``3 (seed 0)``: the id names the run to ``aisafety report ID`` and in SQL."""
    return ", ".join(f"{data.run_id} (seed {data.seed})" for data in runs)


def _cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return f"{statistics.fmean(values):.4g} ± {statistics.stdev(values):.2g}"


def leaderboard(
    runs: list[RunData], catalog: Catalog, checks: list[Check] = ()
) -> list[dict[str, Any]]:
    """One table per metric family: a row per model, a column per metric, ranked."""
    columns = _columns(runs, catalog)
    models = list(dict.fromkeys(m for data in runs for m in data.model_names))
    model_runs, run_warnings = defaultdict(list), defaultdict(list)
    for data in runs:
        for model in data.model_names:
            model_runs[model].append(data)
            run_warnings[model] += [w.category for w in data.warnings]
    families = []
    for family in sorted({c.family for c in columns.values()}):
        cols = [c for c in columns.values() if c.family == family]
        ranked = [c for c in cols if c.direction in ("higher", "lower")]
        means = {c.label: {m: statistics.fmean(v) for m, v in c.values.items()} for c in cols}
        ranks = {c.label: _ranks(means[c.label], c.direction) for c in ranked}
        rows = []
        for model in models:
            mine = [ranks[c.label][model] for c in ranked if model in ranks[c.label]]
            cells = []
            for c in cols:
                values = c.values.get(model)
                best = bool(values) and c.label in ranks and ranks[c.label].get(model) == 1
                cells.append({"text": _cell(values) if values else "—", "best": best})
            rows.append(
                {
                    "model": model,
                    "runs": _runs_cell(model_runs[model]),
                    "warnings": sum(c.status == "warn" and c.model == model for c in checks),
                    "run_warnings": counted(run_warnings[model], "run warning"),
                    "mean_rank": _mean_rank(mine),
                    "cells": cells,
                }
            )
        rows.sort(key=lambda r: r["mean_rank"])
        for row, rank in zip(rows, shared_ranks([r["mean_rank"] for r in rows]), strict=True):
            row["rank"], row["mean_rank"] = rank, float(row["mean_rank"])
        families.append({"name": family, "columns": cols, "rows": rows})
    return families


def overlay_curves(runs: list[RunData]) -> list[Plot]:
    """Robust accuracy against budget, one figure per attack, one line per model (runs of
    one model at several seeds are averaged)."""
    points: dict[tuple[str, str], dict[str, dict[float, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for data in runs:
        for a in data.attack_runs:
            points[(a.attack, a.norm or "-")][a.model][a.eps].append(a.robust_accuracy)
        for model in data.model_names:
            for (norm, eps), (acc, _) in worst_case_of(data, model).items():
                points[("worst case per sample", norm)][model][eps].append(acc)
    plots = []
    for (attack, norm), per_model in points.items():
        series = [
            Series(model, sorted(by_eps), [statistics.fmean(by_eps[e]) for e in sorted(by_eps)])
            for model, by_eps in per_model.items()
        ]
        plots.append(line_plot(f"{attack} ({norm})", series, f"eps ({norm})", "robust accuracy"))
    return plots


def build_comparison(
    store: ResultStore, run_ids: list[int], registry: Registry | None = None
) -> str:
    """The comparison page of several runs: leaderboard per metric family + overlaid curves."""
    if not run_ids:
        raise ConfigError("--compare needs at least one run id (or model name)")
    catalog = catalog_of(registry)
    runs = [load_run(store, run_id) for run_id in run_ids]
    checks = [c for data in runs for c in sanity_checks(data, catalog.attack_defaults)]
    report = Report(runs[0], checks, catalog)
    report.glossary = glossary([m.name for data in runs for m in data.metrics], catalog)
    rendered = comparison_notes(runs, report)
    rendered += [
        RenderedSection(
            "leaderboard",
            "Leaderboard",
            report.template("leaderboard.html.j2", families=leaderboard(runs, catalog, checks)),
        ),
        RenderedSection(
            "curves",
            "Robust accuracy against budget",
            report.template("plots.html.j2", plots=overlay_curves(runs), note=""),
        ),
    ]
    if checks:
        rendered.append(
            RenderedSection(
                "sanity", "Sanity checks", report.template("sanity.html.j2", checks=checks)
            )
        )
    models = ", ".join(dict.fromkeys(m for data in runs for m in data.model_names))
    subtitle = f"runs {', '.join(map(str, run_ids))}: {models}{unfinished_note(runs)}"
    return page("AISafety comparison", subtitle, rendered, report.plots)


def comparison_notes(runs: list[RunData], report: Report) -> list[RenderedSection]:
    """Above the leaderboard, since they say how far to trust it: what makes the runs
    incomparable, and the warnings they raised (each only when there is some)."""
    notes = []
    found = differences(runs)
    if found:
        html = report.template("comparability.html.j2", runs=runs, differences=found)
        notes.append(RenderedSection("comparability", "Not like for like", html))
    warned = [data for data in runs if data.warnings]
    if warned:
        html = report.template("compared_warnings.html.j2", runs=warned)
        notes.append(RenderedSection("warnings", "Warnings", html))
    return notes


def runs_of_model(name: str):
    """The runs holding metric rows of model ``name``: those that stored them, and those
    that reused their units (``--resume``, ``reused_units``): a resumed run that computed
    nothing itself is still the model's latest run, not the interrupted one it read from."""
    from sqlalchemy import and_, select, union

    from aisafety.store import schema

    metric, model, reused = schema.MetricValueRow, schema.Model, schema.ReusedUnit
    stored = select(metric.run_id).join(model, model.id == metric.model_id)
    took = (
        select(reused.run_id)
        .join(
            metric,
            and_(metric.run_id == reused.source_run_id, metric.unit_key == reused.unit_key),
        )
        .join(model, model.id == metric.model_id)
    )
    return union(stored.where(model.name == name), took.where(model.name == name))


def resolve_runs(store: ResultStore, names: list[str]) -> list[int]:
    """Run ids from ``--compare`` arguments: an id, or a model name (its latest finished run,
    or every run of it at distinct seeds when it was evaluated with ``seeds:``)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from aisafety.store import schema

    run_ids: list[int] = []
    for name in names:
        if name.isdigit():
            run_ids.append(int(name))
            continue
        with Session(store.engine) as session:
            ids = sorted(set(session.scalars(runs_of_model(name))), reverse=True)
            models = sorted(set(session.scalars(select(schema.Model.name))))
        if not ids:
            raise ConfigError(
                f"--compare {name!r} is neither a run id nor a model in {shown_url(store.url)!r} "
                f"(models there: {', '.join(models) or 'none'})"
            )
        run_ids.append(ids[0])
    return list(dict.fromkeys(run_ids))
