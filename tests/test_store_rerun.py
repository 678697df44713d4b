"""Running the same plan twice into one database keeps both runs; --resume shows the latest."""

from __future__ import annotations

from aisafety.interfaces import EvaluationPlan
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


def test_same_plan_twice_into_one_database(tmp_path):
    plan = EvaluationPlan.model_validate({"dataset": {"limit": 20}, "metrics": ["ca"]})
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    first = Runner(plan, store, quiet=True).run()
    second = Runner(plan, store, quiet=True).run()  # used to fail: UNIQUE constraint units.key
    resumed = Runner(plan, store, resume=True, quiet=True).run()
    _, rows = store.query("SELECT run_id, value FROM results WHERE metric = 'ca' ORDER BY run_id")
    assert [r[0] for r in rows] == [first.run_id, second.run_id]
    assert resumed.resumed_units == 1
    assert [v.value for v in resumed.values] == [rows[-1][1]]  # one value, not one per run
