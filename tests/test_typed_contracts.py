"""The metric contract is typed: ``compute`` returns a list of ``MetricValue``, and the
per-sample records the store writes are typed fields, not dictionary keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from aisafety.errors import PluginError
from aisafety.evaluation.base import CleanMetric, checked_values
from aisafety.interfaces import Direction, MetricValue, SampleVerdict, SmoothingCertificates


class Single(CleanMetric):
    name = "single"
    direction = Direction.HIGHER

    def compute(self, ctx):
        return self.value(1.0, 1)


def test_a_metric_must_return_a_list_and_is_named_when_it_does_not():
    metric = Single()
    one = metric.value(1.0, 1)
    assert checked_values(metric, [one]) == [one]
    assert checked_values(metric, []) == []
    with pytest.raises(PluginError, match=r"'single'.*returned MetricValue.*\[self\.value"):
        checked_values(metric, one)
    with pytest.raises(PluginError, match="returned a list holding float"):
        checked_values(metric, [1.0])


def test_per_sample_records_are_typed_fields():
    verdict = SampleVerdict(sample_index=0, label=3, verdict="certified", margin=0.1, seconds=1)
    certificates = SmoothingCertificates(
        setting="k", norm="l2", sample_index=[0, 1], label=[3, 4], prediction=[3, -1],
        p_a_lower=[0.9, 0.4], radius=[0.5, 0.0], seconds=[1.0, 1.0],
    )  # fmt: skip
    value = Single().value(
        0.5, 2, verdicts=[verdict], smoothing_certificates=certificates, norm="l2"
    )
    assert value.verdicts == (verdict,) and value.smoothing_certificates is certificates
    assert value.details == {"norm": "l2"}  # only free-form extras go to the JSON column
    with pytest.raises(ValidationError, match="one entry per image"):
        SmoothingCertificates(**{**certificates.model_dump(), "radius": [0.5]})
    with pytest.raises(ValidationError):
        MetricValue(metric="m", value=0, direction="higher", n_samples=1, verdicts=[{"x": 1}])
