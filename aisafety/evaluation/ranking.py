"""Do robustness metrics rank models alike? Rank correlations across models and a per-sample
rank-sum test between two models (``aisafety compare``).

Every (metric, attack, budget) a plan produced for every model becomes one column; for each
pair of columns we give Spearman's rho and Kendall's tau (tau-b) across the models that have
both (scipy.stats). Correlations are on the raw values: a metric whose better direction is
``lower`` (ROBY, ASR) agrees with robust accuracy when its correlation is *negative*. For
metrics that store one value per sample (``details.per_sample``, e.g. adversarial
hypervolume) the Wilcoxon rank-sum test compares two models' per-sample values, as the AH
paper's Table II does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from scipy import stats

from aisafety.interfaces import Direction, MetricValue


def column_name(value: MetricValue) -> str:
    """``metric`` alone for clean metrics, ``metric @ attack eps=...`` per attack budget."""
    if value.attack is None:
        return value.metric
    return f"{value.metric} @ {value.attack} eps={value.eps:g}"


@dataclass(frozen=True)
class Column:
    name: str
    direction: Direction
    values: dict[str, float]  # model -> value (NaN left out)


def metric_columns(results: Mapping[str, Sequence[MetricValue]]) -> list[Column]:
    """One column per metric row name, in first-seen order; NaN values are left out."""
    columns: dict[str, Column] = {}
    for model, values in results.items():
        for value in values:
            name = column_name(value)
            column = columns.setdefault(name, Column(name, value.direction, {}))
            if not math.isnan(value.value):
                column.values[model] = value.value
    return list(columns.values())


@dataclass(frozen=True)
class Correlation:
    first: str
    second: str
    models: int
    spearman: float
    spearman_p: float
    kendall: float
    kendall_p: float


def rank_correlations(columns: Sequence[Column]) -> list[Correlation]:
    """Spearman and Kendall correlation across models for every pair of columns where one
    is defined: at least 3 common models, and neither column constant on them (a rank
    correlation of 2 models, or of a constant, is undefined: such pairs are left out, and
    ``undefined_correlations`` says why, rather than a table of NaN)."""
    rows = []
    for a, b in combinations(columns, 2):
        models = [m for m in a.values if m in b.values]
        x, y = [a.values[m] for m in models], [b.values[m] for m in models]
        if len(models) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
            continue
        rho, rho_p = stats.spearmanr(x, y)
        tau, tau_p = stats.kendalltau(x, y)
        rows.append(
            Correlation(a.name, b.name, len(models), float(rho), float(rho_p), float(tau),
                        float(tau_p))
        )  # fmt: skip
    return rows


def undefined_correlations(columns: Sequence[Column]) -> str | None:
    """Why pairs of columns have no rank correlation (None when every pair has one)."""
    pairs = list(combinations(columns, 2))
    n_models = len({m for c in columns for m in c.values})
    left_out = len(pairs) - len(rank_correlations(columns))
    if not pairs or left_out == 0:
        return None
    if n_models < 3:
        return (
            f"rank correlations: none, a rank correlation needs at least 3 models and "
            f"{n_models} were compared (give 3 or more to --models)"
        )
    return (
        f"rank correlations: {left_out} of {len(pairs)} pairs of metrics left out, with "
        "fewer than 3 models in common or a metric equal on every model (undefined there)"
    )


@dataclass(frozen=True)
class RankSum:
    metric: str
    baseline: str
    model: str
    baseline_mean: float
    model_mean: float
    statistic: float
    p_value: float
    verdict: str  # '+' model better, '-' worse, '=' no difference at the 0.05 level


def rank_sum_tests(
    results: Mapping[str, Sequence[MetricValue]], baseline: str, alpha: float = 0.05
) -> list[RankSum]:
    """Wilcoxon rank-sum test (two-sided) of each model's per-sample values against the
    baseline's, for every metric that stores ``details.per_sample``."""
    per_sample = {
        model: {column_name(v): v for v in values if "per_sample" in v.details}
        for model, values in results.items()
    }
    tests = []
    for name, base in per_sample.get(baseline, {}).items():
        for model, values in per_sample.items():
            if model == baseline or name not in values:
                continue
            other = values[name]
            a, b = base.details["per_sample"], other.details["per_sample"]
            statistic, p = stats.ranksums(b, a)
            better = statistic > 0 if other.direction is Direction.HIGHER else statistic < 0
            verdict = "=" if p >= alpha else ("+" if better else "-")
            tests.append(
                RankSum(name, baseline, model, base.value, other.value, float(statistic),
                        float(p), verdict)
            )  # fmt: skip
    return tests
