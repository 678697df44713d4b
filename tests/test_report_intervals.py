"""The report's Clopper-Pearson intervals equal scipy's exact binomial intervals."""

from __future__ import annotations

import pytest
from scipy.stats import binomtest

from aisafety.report.intervals import clopper_pearson, is_rate, rate_interval


@pytest.mark.parametrize(
    ("k", "n"), [(0, 1), (1, 1), (0, 10), (3, 10), (10, 10), (512, 1000), (999, 1000), (37, 200)]
)
def test_equals_scipy_exact_interval(k: int, n: int) -> None:
    ours = clopper_pearson(k, n)
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert ours == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_other_level_and_known_value() -> None:
    ci = binomtest(7, 50).proportion_ci(confidence_level=0.9, method="exact")
    assert clopper_pearson(7, 50, 0.9) == pytest.approx((ci.low, ci.high), abs=1e-12)
    # closed form at k = 0: upper = 1 - (alpha/2)^(1/n)
    assert clopper_pearson(0, 20)[1] == pytest.approx(1 - 0.025 ** (1 / 20), abs=1e-12)


def test_bit_for_bit_scipy_stats_beta_quantiles() -> None:
    """``betaincinv`` stands in for ``beta.ppf`` (a lighter import): no stored interval moves."""
    from scipy.stats import beta

    for n in [*range(1, 41), 200, 1000, 10_000]:  # every n <= 1,000 when it was written
        for k in range(n + 1) if n <= 40 else [*range(0, n, n // 40), n - 1, n]:
            for level in (0.95, 0.9):
                a = 1 - level
                low = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
                high = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
                assert clopper_pearson(k, n, level) == (low, high), (k, n, level)


def test_stored_rate_recovers_its_count() -> None:
    assert rate_interval(0.37, 200) == clopper_pearson(74, 200)
    assert is_rate("fraction", 0.5, 10)
    assert not is_rate("probability", 0.5, 10)
    assert not is_rate("fraction", float("nan"), 10)


@pytest.mark.parametrize(("k", "n"), [(-1, 10), (11, 10), (0, 0)])
def test_rejects_impossible_counts(k: int, n: int) -> None:
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(k, n)


@pytest.mark.parametrize("name", ["kmncov", "nbcov", "snacov", "tkncov"])
def test_neuron_coverage_gets_no_binomial_interval_in_the_table_or_the_store(name) -> None:
    """tkncov 0.16 on 3 images was printed and stored with [0, 0.7076], the interval of 0
    correct images out of 3: coverage is a share of neurons, not of the images."""
    from aisafety.plugins import default_registry
    from aisafety.report.table import metric_rows
    from aisafety.store.results import _interval

    coverage = default_registry().create("metric", name).value(0.1613, 3)
    _, rows = metric_rows([coverage])
    assert rows[0][4:6] == (None, None)
    assert _interval(coverage) == {"ci_low": None, "ci_high": None}
    accuracy = default_registry().create("metric", "ca").value(0.25, 4)
    assert metric_rows([accuracy])[1][0][4] is not None  # a rate keeps its interval
