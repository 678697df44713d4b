"""Plain-text, CSV and JSON rendering of result rows."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the command line renders tables without pydantic
    from aisafety.interfaces import MetricValue


def cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps(
            [dict(zip(columns, row, strict=True)) for row in rows], indent=2, default=str
        )
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows(rows)
        return buffer.getvalue().rstrip("\n")
    cells = [[cell_text(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(out)


def metric_rows(values: Sequence[MetricValue]) -> tuple[list[str], list[tuple]]:
    """One row per value; rates (unit "fraction") with their 95% Clopper-Pearson interval."""
    from aisafety.report.intervals import is_rate, rate_interval

    columns = ["metric", "attack", "eps", "value", "ci95_low", "ci95_high", "better", "n"]
    rows = []
    for v in values:
        ci = rate_interval(v.value, v.n_samples) if is_rate(v.unit, v.value, v.n_samples) else None
        low, high = ci if ci else (None, None)
        rows.append(
            (v.metric, v.attack or "", v.eps, v.value, low, high, v.direction.value, v.n_samples)
        )
    return columns, rows


CURVE_METRICS = ("aab", "aaw", "robust-accuracy")  # one number; later names take precedence


def curve_rows(values: Sequence[MetricValue]) -> tuple[list[str], list[tuple]] | None:
    """Accuracy against budget: one row per attack, one column per budget (eps 0 = ``ca``),
    from robust accuracy, or AAW / AAB where the plan asked for those only.

    ``None`` when the run has no robust-accuracy values to draw a curve from.
    """
    points: dict[tuple[str | None, float | None], float] = {}
    for metric in CURVE_METRICS:
        points.update({(v.attack, v.eps): v.value for v in values if v.metric == metric})
    if not points:
        return None
    clean = next((v.value for v in values if v.metric == "ca"), None)
    budgets = sorted({eps for _, eps in points if eps is not None})
    attacks = list(dict.fromkeys(attack for attack, _ in points))
    columns = ["attack", "eps 0 (ca)", *(f"eps {eps:g}" for eps in budgets)]
    rows = [(attack, clean, *(points.get((attack, eps)) for eps in budgets)) for attack in attacks]
    return columns, rows


def seed_rows(
    runs: Sequence[tuple[int, Sequence[MetricValue]]],
) -> tuple[list[str], list[tuple]]:
    """One row per metric value over runs at several seeds: mean, sample std and each seed's."""
    by_key: dict[tuple, dict[int, float]] = {}
    meta: dict[tuple, MetricValue] = {}
    for seed, values in runs:
        for v in values:
            key = (v.metric, v.attack, v.eps)
            by_key.setdefault(key, {})[seed] = v.value
            meta.setdefault(key, v)
    seeds = [seed for seed, _ in runs]
    columns = ["metric", "attack", "eps", "mean", "std", "better", *(f"seed {s}" for s in seeds)]
    rows = []
    for key, per_seed in by_key.items():
        found = [x for x in per_seed.values() if not math.isnan(x)]
        mean = statistics.fmean(found) if found else float("nan")
        std = statistics.stdev(found) if len(found) > 1 else float("nan")
        rows.append(
            (
                *key[:2],
                key[2],
                mean,
                std,
                meta[key].direction.value,
                *(per_seed.get(s) for s in seeds),
            )
        )
    return columns, rows
