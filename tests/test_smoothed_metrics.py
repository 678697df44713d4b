"""The smoothed-certification metrics through the runner: values, per-image rows, errors."""

from __future__ import annotations

import numpy as np
import pytest

from aisafety.errors import ConfigError
from aisafety.interfaces import DatasetSpec, DefenseSpec, EvaluationPlan, MetricSpec, ModelSpec
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

SETTING = {"n0": 20, "n": 200, "sigma": 0.25}


def plan(defenses=(), **setting) -> EvaluationPlan:
    setting = setting or SETTING
    return EvaluationPlan(
        model=ModelSpec(name="mnist-cnn-gaussian-0.25"),
        defenses=defenses,
        dataset=DatasetSpec(limit=20),
        metrics=(
            MetricSpec(name="smoothed-certified-accuracy", config={**setting, "radii": [0, 0.3]}),
            MetricSpec(name="smoothed-average-certified-radius", config=setting),
            MetricSpec(name="smoothed-abstention-rate", config=setting),
        ),
        device="cpu",
    )


def test_values_agree_with_the_stored_per_image_rows(tmp_path):
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    record = Runner(plan(), store, quiet=True).run()
    values = {(v.metric.split("(")[0], v.eps): v.value for v in record.values}
    _, rows = store.query(
        "SELECT label, prediction, abstained, radius, p_a_lower, seconds, norm "
        "FROM smoothing_certificates ORDER BY sample_index"
    )
    assert len(rows) == 20  # written once although three metrics share the certificates
    columns = map(np.array, zip(*rows, strict=True))
    label, prediction, abstained, radius, p_a, seconds, norm = columns
    assert set(norm) == {"l2"}
    correct = prediction == label
    assert values[("smoothed-certified-accuracy", 0.0)] == pytest.approx(correct.mean())
    assert values[("smoothed-certified-accuracy", 0.3)] == pytest.approx(
        (correct & (radius >= 0.3)).mean()
    )
    assert values[("smoothed-average-certified-radius", None)] == pytest.approx(
        np.where(correct, radius, 0).mean()
    )
    assert values[("smoothed-abstention-rate", None)] == pytest.approx(abstained.mean())
    assert (abstained == (p_a < 0.5)).all() and (seconds > 0).all()
    assert values[("smoothed-certified-accuracy", 0.0)] > 0.8  # the model is accurate
    _, details = store.query("SELECT details FROM metric_values")
    assert all("per_sample" not in d[0] for d in details)  # rows, not JSON copies


def test_certifies_the_plans_smoothing_defense_and_names_a_mismatch(tmp_path):
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    defense = (DefenseSpec(name="randomized-smoothing", config={"sigma": 0.5}),)
    record = Runner(plan(defense, n0=20, n=200), store, quiet=True).run()
    assert len(record.values) == 4
    with pytest.raises(ConfigError, match="sigma=0.25 disagrees"):
        Runner(plan(defense), store, quiet=True).run()
