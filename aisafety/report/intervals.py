"""Confidence intervals for accuracy-like metrics (a count of successes out of n samples).

Clopper-Pearson ("exact") intervals: the quantiles of the beta distribution, so the
interval covers the true rate with at least the stated probability for every n. The same
numbers as ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``.

The quantiles come from ``scipy.special.betaincinv``, bit for bit ``scipy.stats.beta.ppf``'s
(every k of every n up to 1,000 at four levels; tests/test_report_intervals.py) at a third
of the import: every ``aisafety evaluate`` that stores a rate and every ``aisafety report``
imported scipy.stats for these two numbers alone (0.61 against 0.21 CPU s after torch).
"""

from __future__ import annotations

import math


def clopper_pearson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The two-sided ``level`` interval of a binomial rate observed as ``successes`` / ``n``."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got {successes} of {n}")
    from scipy.special import betaincinv  # imported here: scipy.special takes a while to load

    alpha = 1.0 - level
    low = 0.0 if successes == 0 else float(betaincinv(successes, n - successes + 1, alpha / 2))
    high = 1.0 if successes == n else float(betaincinv(successes + 1, n - successes, 1 - alpha / 2))
    return low, high


def is_rate(unit: str | None, value: float | None, n: int | None) -> bool:
    """A metric the interval applies to: a fraction of samples (accuracy, success rate)."""
    return (
        unit == "fraction"
        and value is not None
        and not math.isnan(value)
        and n is not None
        and n > 0
        and 0.0 <= value <= 1.0
    )


def rate_interval(value: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The interval of a stored rate: its count is ``round(value * n)`` (rates are counts / n)."""
    return clopper_pearson(round(value * n), n, level)
