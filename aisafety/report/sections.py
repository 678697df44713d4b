"""The report's sections. Each is a plugin class, so a third party adds its own section the
way it adds an attack: return it from the ``aisafety_report_sections`` hook.

A section's ``render(report)`` returns an HTML fragment (use ``report.template`` for
escaping, ``report.plot`` for figures) or ``None`` when the run has nothing for it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, ClassVar, Protocol

import numpy as np
from markupsafe import Markup

from aisafety.report.data import RunData
from aisafety.report.intervals import is_rate, rate_interval
from aisafety.report.plan_view import fold_defaults
from aisafety.report.plots import Series, example_grid, heatmap, line_plot
from aisafety.report.warning_kinds import counted

NOISE = "random-noise"


class ReportView(Protocol):
    """What a section renders from (``aisafety.report_page.Report`` is one). A protocol, so
    sections, which the registry imports, need not import the page builder above it."""

    data: RunData
    checks: list[Any]

    def template(self, name: str, **context: Any) -> Markup: ...

    def attack_defaults(self, attack: str) -> dict[str, Any]: ...


class ReportSection:
    """Base of every report section; ``order`` places it on the page (smaller first)."""

    name: ClassVar[str]
    title: ClassVar[str]
    order: ClassVar[int] = 100

    def render(self, report: ReportView) -> str | None:
        raise NotImplementedError


class Provenance(ReportSection):
    name, title, order = "provenance", "Plan and provenance", 90

    def render(self, report: ReportView) -> str:
        return report.template(
            "provenance.html.j2", data=report.data, plan=fold_defaults(report.data.plan)
        )


def clean_accuracy(report: ReportView, model: str) -> tuple[float, int] | None:
    """The ``ca`` metric, else the clean predictions of the model's first attack run."""
    for m in report.data.metrics:
        if m.model == model and m.name == "ca" and m.value is not None:
            return m.value, m.n_samples
    for a in report.data.attack_runs:
        if a.model == model and a.id in report.data.outcomes:
            correct = report.data.clean_correct(a.id)
            return float(correct.mean()), len(correct)
    return None


def worst_case(report: ReportView, model: str) -> dict[tuple[str, float], tuple[float, int]]:
    """(norm, eps) -> accuracy under the per-sample worst case over every attack run there
    (a sample counts only if no attack broke it), with the number of samples."""
    groups = defaultdict(list)
    for a in report.data.attack_runs:
        if a.model == model and a.id in report.data.outcomes:
            groups[(a.norm or "-", a.eps)].append(report.data.correct(a.id))
    return {
        key: (float(np.logical_and.reduce(masks).mean()), len(masks[0]))
        for key, masks in groups.items()
        if len({len(m) for m in masks}) == 1
    }


def main_budget(report: ReportView, model: str) -> tuple[str, float] | None:
    """The plan's main budget for ``model``: the (norm, eps) the most attacks ran at (the
    one they share), the smaller eps on a tie; None without attack runs."""
    counts: dict[tuple[str, float], int] = defaultdict(int)
    for a in report.data.attack_runs:
        if a.model == model:
            counts[(a.norm or "-", a.eps)] += 1
    if not counts:
        return None
    return min(counts, key=lambda key: (-counts[key], key[1], key[0]))


SEVERITY = {"warn": 0, "skip": 1, "pass": 2}


def verdict(report: ReportView, model: str) -> dict[str, Any] | None:
    """One quotable line: robust accuracy (worst case over the attacks) at the main budget
    with its 95% interval, and the worst sanity check."""
    budget = main_budget(report, model)
    worst = worst_case(report, model)
    if budget is None or budget not in worst:
        return None
    accuracy, n = worst[budget]
    attacks = sum(a.model == model and (a.norm or "-", a.eps) == budget
                  for a in report.data.attack_runs)  # fmt: skip
    checks = sorted((c for c in report.checks if c.model == model),
                    key=lambda c: SEVERITY.get(c.status, 1))  # fmt: skip
    return {"norm": budget[0], "eps": budget[1], "accuracy": accuracy, "n": n,
            "ci": rate_interval(accuracy, n), "attacks": attacks,
            "check": checks[0] if checks else None,
            "passed": sum(c.status == "pass" for c in checks), "checks": len(checks)}  # fmt: skip


class ModelCards(ReportSection):
    name, title, order = "models", "Models", 10

    def render(self, report: ReportView) -> str | None:
        cards = []
        # a warning of the run is about every model's numbers: each card links to them
        run_warnings = counted(w.category for w in report.data.warnings)
        for model in report.data.models:
            name = model["name"]
            checks = [c for c in report.checks if c.model == name]
            cards.append(
                {
                    "model": model,
                    "clean": clean_accuracy(report, name),
                    "worst": sorted(worst_case(report, name).items()),
                    "verdict": verdict(report, name),
                    "warnings": sum(c.status == "warn" for c in checks),
                    "passed": sum(c.status == "pass" for c in checks),
                    "skipped": sum(c.status == "skip" for c in checks),
                    "checks": len(checks),
                    "run_warnings": run_warnings,
                }
            )
        return report.template("cards.html.j2", cards=cards, interval=rate_interval)


class Glossary(ReportSection):
    """Every metric name the page shows, expanded, each linked to where it is defined."""

    name, title, order = "glossary", "Glossary of metrics", 85
    DOCS = "docs/metrics.md"

    def render(self, report: ReportView) -> str | None:
        glossary = getattr(report, "glossary", {})
        if not glossary:
            return None
        return report.template("glossary.html.j2", entries=sorted(glossary.items()),
                               docs=self.DOCS)  # fmt: skip


class Warnings(ReportSection):
    """The warnings the run raised (the model at chance, outputs not repeatable, ...):
    near the top, since they say how far to trust every number below."""

    name, title, order = "warnings", "Warnings", 8

    def render(self, report: ReportView) -> str | None:
        if not report.data.warnings:
            return None
        return report.template(
            "warnings.html.j2", warnings=report.data.warnings, run_id=report.data.run_id
        )


class SanityChecks(ReportSection):
    name, title, order = "sanity", "Sanity checks (gradient masking)", 20

    def render(self, report: ReportView) -> str | None:
        if not report.checks:
            return None
        return report.template("sanity.html.j2", checks=report.checks)


class MetricTable(ReportSection):
    name, title, order = "metrics", "Metrics", 80

    def render(self, report: ReportView) -> str | None:
        rows = []
        not_rates = getattr(report, "not_rates", set())
        for m in report.data.metrics:
            ci = m.ci  # stored; derived from value and n for runs stored before it was
            if ci is None and is_rate(m.unit, m.value, m.n_samples):
                ci = rate_interval(m.value, m.n_samples)
            if m.name in not_rates:
                ci = None  # a share of neurons, not of samples: no binomial interval
            rows.append({"m": m, "ci": ci})
        if not rows:
            return None
        return report.template("metrics.html.j2", rows=rows)


class RobustnessCurves(ReportSection):
    name, title, order = "curves", "Robust accuracy against budget", 30

    def render(self, report: ReportView) -> str | None:
        plots = []
        for model in report.data.model_names:
            runs = [a for a in report.data.attack_runs if a.model == model]
            clean = clean_accuracy(report, model)
            worst = worst_case(report, model)
            for norm in dict.fromkeys(a.norm or "-" for a in runs):
                series = []
                for attack in dict.fromkeys(a.attack for a in runs if (a.norm or "-") == norm):
                    points = sorted(
                        (a.eps, a.robust_accuracy, a.n_samples)
                        for a in runs
                        if a.attack == attack and (a.norm or "-") == norm
                    )
                    if clean is not None and points[0][0] > 0:
                        points.insert(0, (0.0, *clean))
                    style = ":x" if attack.startswith(NOISE) else "-o"
                    series.append(
                        Series(attack, *map(list, zip(*points, strict=True)), style=style)
                    )
                budgets = sorted(
                    (eps, acc, n) for (nm, eps), (acc, n) in worst.items() if nm == norm
                )
                if len({a.attack for a in runs if (a.norm or "-") == norm}) > 1 and budgets:
                    series.append(
                        Series(
                            "worst case per sample",
                            *map(list, zip(*budgets, strict=True)),
                            style="-s",
                        )
                    )
                if series:
                    plots.append(
                        line_plot(
                            f"{model}: robust accuracy, {norm}",
                            series,
                            f"eps ({norm})",
                            "accuracy (95% CI band)",
                        )
                    )
        if not plots:
            return None
        return report.template(
            "plots.html.j2",
            plots=plots,
            note="eps 0 is the clean accuracy on the same samples; the "
            "worst case counts a sample as robust only if no attack at "
            "that budget broke it.",
        )


class Corruptions(ReportSection):
    name, title, order = "corruptions", "Corruption error per type and severity", 40

    def render(self, report: ReportView) -> str | None:
        plots = []
        for model in report.data.model_names:
            errors: dict[str, dict[int, float]] = defaultdict(dict)
            for m in report.data.metrics:
                if m.model == model and m.name in ("mce", "rmce") and "errors" in m.details:
                    for corruption, row in m.details["errors"].items():
                        for s, e in zip(m.details.get("severities", []), row, strict=False):
                            errors[corruption][int(s)] = e
            if not errors:
                continue
            severities = sorted({s for row in errors.values() for s in row})
            names = sorted(errors)
            values = np.array(
                [[errors[c].get(s, np.nan) for s in severities] for c in names], dtype=float
            )
            plots.append(
                heatmap(
                    f"{model}: corruption error",
                    names,
                    [str(s) for s in severities],
                    values,
                    "error rate",
                    "severity",
                )
            )
        if not plots:
            return None
        return report.template("plots.html.j2", plots=plots, note="")


# a whole setting name: ``steps=7`` (an attack's setting in the label) holds ``eps=``
RADIUS = re.compile(r"(?<=[(,])(?:eps|radius|sigma)=([0-9.eE+-]+)")


def _without_radius(label: str) -> str:
    """``certified-accuracy(eps=0.1,verifier=ibp)`` -> ``certified-accuracy(verifier=ibp)``:
    one curve per metric and settings, its points the radii."""
    inner = re.sub(r"(?<=[(,])(?:eps|radius)=[^,)]*,?", "", label).replace(",)", ")")
    return inner.replace("()", "")


def _radius(metric) -> float | None:
    if metric.eps is not None:
        return float(metric.eps)
    for key in ("eps", "radius"):
        if isinstance(metric.details.get(key), int | float):
            return float(metric.details[key])
    found = RADIUS.search(metric.metric)
    return float(found.group(1)) if found else None


class CertifiedCurves(ReportSection):
    name, title, order = "certified", "Certified accuracy", 50

    def render(self, report: ReportView) -> str | None:
        plots = []
        for model in report.data.model_names:
            curves: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
            for m in report.data.metrics:
                curve = m.details.get("curve") if isinstance(m.details, dict) else None
                if m.model != model or "certified" not in m.name:
                    continue
                if m.model == model and m.id in report.data.radii:
                    radii = report.data.radii[m.id]
                    # from just above 0: a misclassified sample has radius 0 too
                    top = max(float(np.nanmax(radii)), 1e-6) * 1.05
                    grid = np.linspace(top / 40, top, 40)
                    curves[f"{m.metric} (per-sample radii)"] += [
                        (float(r), float((radii >= r).mean()), len(radii)) for r in grid
                    ]
                    continue
                if isinstance(curve, dict) and "radius" in curve and "accuracy" in curve:
                    curves[m.metric] += [
                        (float(r), float(v), m.n_samples)
                        for r, v in zip(curve["radius"], curve["accuracy"], strict=False)
                    ]
                elif m.value is not None and (r := _radius(m)) is not None:
                    curves[_without_radius(m.metric)].append((r, m.value, m.n_samples))
            series = [
                Series(name, *map(list, zip(*sorted(points), strict=True)))
                for name, points in curves.items()
            ]
            if series:
                plots.append(
                    line_plot(
                        f"{model}: certified accuracy",
                        series,
                        "radius / eps",
                        "certified accuracy (95% CI band)",
                    )
                )
        if not plots:
            return None
        return report.template(
            "plots.html.j2",
            plots=plots,
            note="a sound certificate is a lower bound on robust accuracy.",
        )


def _frontiers(details: dict) -> tuple[list[float], np.ndarray] | None:
    """A stored per-sample frontier: ``budgets`` (k,) and ``frontier`` (n, k) rows of the
    margin reached at each budget (adversarial-hypervolume's details)."""
    budgets, frontier = details.get("budgets"), details.get("frontier")
    if not isinstance(budgets, list) or not isinstance(frontier, list) or not frontier:
        return None
    rows = np.asarray(frontier, dtype=float)
    if rows.ndim != 2 or rows.shape[1] != len(budgets):
        return None
    return [float(b) for b in budgets], rows


class Frontier(ReportSection):
    name, title, order = "frontier", "Adversarial frontier", 60
    shown = 60  # per-sample lines drawn (all of them make a grey blur)

    def render(self, report: ReportView) -> str | None:
        from aisafety.report.plots import frontier_plot

        plots = []
        for m in report.data.metrics:
            found = _frontiers(m.details)
            if found is not None:
                budgets, rows = found
                value = "nan" if m.value is None else f"{m.value:.4g}"
                plots.append(
                    frontier_plot(f"{m.model}: {m.metric} = {value}", budgets, rows, self.shown)
                )
        if not plots:
            return None
        return report.template(
            "plots.html.j2",
            plots=plots,
            note="grey: the margin each sample keeps as the budget grows (its frontier; "
            "below 0 it is misclassified); black: the mean over samples.",
        )


class Examples(ReportSection):
    name, title, order = "examples", "Example images", 70

    def render(self, report: ReportView) -> str | None:
        chosen = {}
        for a in report.data.attack_runs:  # per attack and model: its largest budget
            if a.id in report.data.examples and not a.attack.startswith(NOISE):
                key = (a.model, a.attack)
                if key not in chosen or a.eps > chosen[key].eps:
                    chosen[key] = a
        plots = []
        for (model, attack), run in chosen.items():
            examples = report.data.examples[run.id]
            outcomes = report.data.outcomes.get(run.id)
            captions = []
            for e in examples:
                caption = f"#{e.sample_index}"
                if outcomes is not None and e.sample_index < len(outcomes["label"]):
                    i = e.sample_index
                    caption += (
                        f" y={outcomes['label'][i]} {outcomes['clean_pred'][i]}"
                        f"→{outcomes['adv_pred'][i]}"
                    )
                captions.append(caption)
            eps = f" eps {run.eps:g}"
            plots.append(
                example_grid(
                    f"{model}: {attack}{eps}",
                    [e.clean for e in examples],
                    [e.adversarial for e in examples],
                    captions,
                )
            )
        if not plots:
            return None
        return report.template(
            "plots.html.j2",
            plots=plots,
            note="caption: sample, label, clean → adversarial prediction.",
        )


class UnitCosts(ReportSection):
    """What each unit cost: where a run's time and memory went, to size a larger one."""

    name, title, order = "unit-costs", "Time and peak memory per unit", 88

    def render(self, report: ReportView) -> str | None:
        if not report.data.units:
            return None
        units = report.data.units
        reused = any(u.from_run is not None for u in units)
        return report.template("units.html.j2", units=units, reused=reused)


BUILTIN_SECTIONS = [
    Warnings,
    Provenance,
    UnitCosts,
    ModelCards,
    SanityChecks,
    MetricTable,
    Glossary,
    RobustnessCurves,
    Corruptions,
    CertifiedCurves,
    Frontier,
    Examples,
]


def finite(value: float | None) -> bool:
    return value is not None and not math.isnan(value)
