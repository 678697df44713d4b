"""End to end through the runner and the results store: units, resume, the results view."""

from __future__ import annotations

import math

import pytest

from aisafety.evaluation.metrics.accuracy import AdversarialAccuracyWhiteBox
from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

PLAN = EvaluationPlan(
    dataset=DatasetSpec(limit=60),
    attacks=(
        AttackSpec(name="fgsm", eps=(0.1, 0.3)),
        AttackSpec(name="pgd-linf", config={"steps": 5}, eps=0.3),
    ),
    metrics=tuple(MetricSpec(name=n) for n in ("ca", "aaw", "acac", "ald", "ass")),
    device="cpu",
)


@pytest.fixture()
def store(tmp_path):
    return ResultStore(f"sqlite:///{tmp_path / 'r.db'}")


def _by_key(values):
    return {(v.metric, v.attack, v.eps): v.value for v in values}


def test_values_stored_match_returned_values(store):
    record = Runner(PLAN, store, quiet=True).run()
    values = _by_key(record.values)
    # 1 clean unit (ca) + 3 attack units x 4 per-attack metrics
    assert len(values) == 1 + 3 * 4
    columns, rows = store.query("SELECT metric, attack, eps, value FROM results")
    stored = {(m, a, e): v for m, a, e, v in rows}
    assert stored.keys() == values.keys()
    for key, value in values.items():
        assert (math.isnan(value) and stored[key] is None) or stored[key] == pytest.approx(value)
    assert values[("aaw", "pgd-linf(steps=5)", 0.3)] <= values[("ca", None, None)]


def test_sample_outcomes_agree_with_attack_runs(store):
    Runner(PLAN, store, quiet=True).run()
    _, rows = store.query(
        "SELECT ar.attack, ar.eps, ar.robust_accuracy, "
        "AVG(CASE WHEN so.adv_pred = so.label THEN 1.0 ELSE 0.0 END), COUNT(*), MAX(so.linf) "
        "FROM attack_runs ar JOIN sample_outcomes so ON so.attack_run_id = ar.id "
        "GROUP BY ar.id"
    )
    assert len(rows) == 3
    for _attack, eps, robust, recomputed, count, max_linf in rows:
        assert count == 60
        assert robust == pytest.approx(recomputed)
        assert max_linf <= eps + 1e-6


def test_resume_skips_finished_units_and_returns_same_numbers(store):
    first = Runner(PLAN, store, quiet=True).run()
    second = Runner(PLAN, store, quiet=True, resume=True).run()
    assert second.resumed_units == 4
    assert _by_key(second.values) == pytest.approx(_by_key(first.values), nan_ok=True)
    _, runs = store.query("SELECT COUNT(*) FROM units")
    assert runs[0][0] == 4


def test_interrupted_run_keeps_finished_units(store, monkeypatch):
    calls = {"n": 0}
    original = AdversarialAccuracyWhiteBox.compute

    def failing_on_third(self, ctx, attack, eps):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return original(self, ctx, attack, eps)

    monkeypatch.setattr(AdversarialAccuracyWhiteBox, "compute", failing_on_third)
    with pytest.raises(RuntimeError, match="simulated crash"):
        Runner(PLAN, store, quiet=True).run()
    _, status = store.query("SELECT status FROM runs")
    assert status == [("failed",)]
    _, units = store.query("SELECT COUNT(*) FROM units")
    assert units[0][0] == 3  # clean + the two FGSM budgets were committed
    monkeypatch.setattr(AdversarialAccuracyWhiteBox, "compute", original)
    resumed = Runner(PLAN, store, quiet=True, resume=True).run()
    assert resumed.resumed_units == 3
    _, counts = store.query("SELECT COUNT(*) FROM attack_runs")
    assert counts[0][0] == 3  # the PGD unit ran once, nothing twice


def test_defended_model_is_a_separate_model_row(store):
    plan = EvaluationPlan(
        **{
            **PLAN.model_dump(),
            "attacks": (),
            "defenses": [{"name": "bit-depth", "config": {"bits": 1}}],
        }
    )
    Runner(PLAN.model_copy(update={"attacks": ()}), store, quiet=True).run()
    Runner(plan, store, quiet=True).run()
    _, rows = store.query("SELECT model, value FROM results WHERE metric = 'ca' ORDER BY model")
    assert [r[0] for r in rows] == ["mnist-cnn", "mnist-cnn+bit-depth(bits=1)"]


def test_bad_database_url_is_a_clear_error():
    from aisafety.errors import ConfigError

    with pytest.raises(ConfigError, match="SQLAlchemy URL"):
        ResultStore("results.db")
    with pytest.raises(ConfigError, match="query failed"):
        ResultStore("sqlite://").query("SELECT * FROM no_such_table")


def test_each_verifier_metric_is_a_resumable_unit_of_its_own(store, monkeypatch):
    """A killed run loses at most the verifier metric it was in: the finished ones are
    stored units that ``--resume`` takes from the database."""
    from aisafety.evaluation.metrics.certified import CertifiedAccuracy

    certified = [
        MetricSpec(name="ibp-certified-accuracy", config={"eps": eps}) for eps in (0.01, 0.05, 0.1)
    ]
    plan = PLAN.model_copy(update={"attacks": (), "metrics": (MetricSpec(name="ca"), *certified)})
    calls, kill_at = [], {"eps": 0.1}
    original = CertifiedAccuracy.compute

    def killed_at(self, ctx):
        calls.append(self.config.eps)
        if self.config.eps == kill_at["eps"]:
            raise RuntimeError("simulated kill")
        return original(self, ctx)

    monkeypatch.setattr(CertifiedAccuracy, "compute", killed_at)
    with pytest.raises(RuntimeError, match="simulated kill"):
        Runner(plan, store, quiet=True).run()
    _, units = store.query("SELECT description FROM units ORDER BY finished_at, rowid")
    assert [u for (u,) in units] == [
        "clean metrics on mnist-embedded",
        "ibp-certified-accuracy(eps=0.01) on mnist-embedded",
        "ibp-certified-accuracy(eps=0.05) on mnist-embedded",
    ]
    kill_at["eps"] = None
    calls.clear()
    resumed = Runner(plan, store, quiet=True, resume=True).run()
    assert resumed.resumed_units == 3  # the cheap clean unit and two certified ones
    assert calls == [0.1]  # only the metric the kill lost runs again
    fresh = Runner(plan, ResultStore(store.url.replace("r.db", "fresh.db")), quiet=True).run()
    assert _by_key(resumed.values) == pytest.approx(_by_key(fresh.values))
    assert len(_by_key(fresh.values)) == 4
