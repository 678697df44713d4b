"""A resumed run's report covers every unit of its plan: those it computed and those it took
from the interrupted run (``reused_units``), bit for bit what an uninterrupted run shows."""

from __future__ import annotations

import pytest

from aisafety.check import stored_run
from aisafety.evaluation.metrics.accuracy import AdversarialAccuracyWhiteBox
from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec
from aisafety.report.data import load_run
from aisafety.report_page import worst_case_of
from aisafety.runner import Runner
from aisafety.sanity import sanity_checks
from aisafety.store.results import ResultStore

# Two attacks at the same budgets: interrupted after FGSM's units, the worst case at each
# budget needs FGSM's rows (the interrupted run's) and PGD's (the resumed run's).
PLAN = EvaluationPlan(
    dataset=DatasetSpec(limit=12),
    attacks=(
        AttackSpec(name="fgsm", eps=(0.1, 0.3)),
        AttackSpec(name="pgd-linf", config={"steps": 3}, eps=(0.1, 0.3)),
    ),
    metrics=(MetricSpec(name="ca"), MetricSpec(name="aaw")),
    device="cpu",
)


def _interrupted_then_resumed(store: ResultStore, monkeypatch) -> tuple[int, int]:
    """Ctrl-C during the third attack unit (clean and FGSM's two stored), then --resume."""
    calls, original = {"n": 0}, AdversarialAccuracyWhiteBox.compute

    def interrupted_third(self, ctx, attack, eps):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, ctx, attack, eps)

    monkeypatch.setattr(AdversarialAccuracyWhiteBox, "compute", interrupted_third)
    with pytest.raises(KeyboardInterrupt):
        Runner(PLAN, store, quiet=True).run()
    monkeypatch.setattr(AdversarialAccuracyWhiteBox, "compute", original)
    resumed = Runner(PLAN, store, quiet=True, resume=True).run()
    assert resumed.resumed_units == 3
    return 1, resumed.run_id


def _shown(store: ResultStore, run_id: int) -> dict:
    """What the report reads of a run, without ids and timings."""
    data = load_run(store, run_id)
    runs = {a.id: (a.attack, a.eps) for a in data.attack_runs}
    return {
        "metrics": sorted(
            (m.model, m.metric, m.attack or "", m.eps or 0.0, m.value, m.n_samples, m.ci)
            for m in data.metrics
        ),
        "attack_runs": sorted(
            (a.attack, a.eps, a.robust_accuracy, a.n_samples) for a in data.attack_runs
        ),
        "outcomes": {
            runs[i]: {k: v.tolist() for k, v in o.items()} for i, o in data.outcomes.items()
        },
        "worst_case": worst_case_of(data, data.model_names[0]),
        "sanity": sorted((c.check, c.status, c.detail) for c in sanity_checks(data)),
        "models": data.model_names,
    }


def test_a_resumed_run_reports_every_unit_as_an_uninterrupted_run(tmp_path, monkeypatch):
    store = ResultStore(f"sqlite:///{tmp_path / 'resumed.db'}")
    interrupted, resumed = _interrupted_then_resumed(store, monkeypatch)
    whole = ResultStore(f"sqlite:///{tmp_path / 'whole.db'}")
    uninterrupted = Runner(PLAN, whole, quiet=True).run().run_id
    shown, expected = _shown(store, resumed), _shown(whole, uninterrupted)
    assert len(shown["attack_runs"]) == 4 and len(shown["worst_case"]) == 2
    assert shown == expected  # floats compared with ==: bit for bit
    # the report says which units came from the interrupted run
    units = load_run(store, resumed).units
    assert sorted((u.description, u.from_run) for u in units) == [
        ("clean metrics on mnist-embedded", interrupted),
        ("fgsm eps=0.1", interrupted),
        ("fgsm eps=0.3", interrupted),
        ("pgd-linf(steps=3) eps=0.1", None),
        ("pgd-linf(steps=3) eps=0.3", None),
    ]
    # the interrupted run's own report is still only what it stored
    assert len(load_run(store, interrupted).attack_runs) == 2


def test_check_reuses_a_resumed_run_of_the_plan(tmp_path, monkeypatch):
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    _, resumed = _interrupted_then_resumed(store, monkeypatch)
    runner = Runner(PLAN, store, quiet=True)
    keys = [u.key for u in runner.work_units(runner.prepare().subject)]
    # its units are the interrupted run's three and its own two (main: None, evaluated again)
    assert stored_run(store, keys, PLAN.model.name) == resumed


def test_compare_by_model_name_picks_a_resumed_run_that_computed_nothing(tmp_path, monkeypatch):
    """A second --resume after the plan finished reuses all five units and stores no metric
    row of its own: it is the model's latest run, and ``--compare MODEL`` must name it, not
    the run before (the latest one with rows of its own)."""
    from aisafety.report_page import resolve_runs

    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    _, resumed = _interrupted_then_resumed(store, monkeypatch)
    again = Runner(PLAN, store, quiet=True, resume=True).run()
    assert again.resumed_units == 5
    assert resolve_runs(store, [PLAN.model.name]) == [again.run_id]
    assert _shown(store, again.run_id) == _shown(store, resumed)
