"""The results store on a real PostgreSQL server (started by the tests on 127.0.0.1, see
testkit/postgres_server.py): same numbers as SQLite, many concurrent writers, and one unit
stored once however often a retried task writes it (docs/scale-out.md)."""

from __future__ import annotations

import threading

from sqlalchemy import text

from aisafety.interfaces import AttackSpec, DatasetSpec, EvaluationPlan, MetricSpec, MetricValue
from aisafety.runner import Runner
from aisafety.store.compare import compare
from aisafety.store.results import ResultStore, Subject

PLAN = EvaluationPlan(
    dataset=DatasetSpec(limit=20),
    attacks=(AttackSpec(name="fgsm", eps=(0.1, 0.3)),),
    metrics=tuple(MetricSpec(name=n) for n in ("ca", "aaw", "acac")),
    device="cpu",
)


def _subject() -> Subject:
    return Subject("m", "f" * 16, {}, "labels", "d", "test", 1, "g" * 16, {})


def _value(x: float) -> MetricValue:
    return MetricValue(metric="ca", value=x, direction="higher", n_samples=1)


def _count(store: ResultStore, table: str) -> int:
    with store.engine.connect() as connection:
        return connection.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()


def test_a_plan_stores_the_same_numbers_on_postgresql_as_on_sqlite(postgres_url, tmp_path):
    sqlite_url = f"sqlite:///{tmp_path / 'local.db'}"
    Runner(PLAN, ResultStore(sqlite_url), quiet=True).run()
    store = ResultStore(postgres_url)
    Runner(PLAN, store, quiet=True).run()
    counts, differences = compare(sqlite_url, postgres_url)
    assert differences == []
    assert counts == {"metric_values": 5, "attack_runs": 2, "sample_outcomes": 40}
    # --resume on PostgreSQL finds every unit finished and recomputes nothing
    record = Runner(PLAN, store, resume=True, quiet=True).run()
    assert record.resumed_units == 3


def test_a_seed_beyond_32_bits_is_stored(postgres_url):
    store = ResultStore(postgres_url)
    run_id = store.start_run(PLAN.model_copy(update={"seed": 2**63 - 1}), "test", "cpu")
    assert store.query(f"SELECT seed FROM runs WHERE id = {run_id}")[1] == [(2**63 - 1,)]
    store.finish_run(run_id)


def test_many_writers_at_once_and_a_unit_written_twice_is_stored_once(postgres_url):
    """16 threads (16 connections) write at once: 10 distinct units and 6 attempts of one
    unit of the same run (a task Ray retried after its first attempt had committed)."""
    store = ResultStore(postgres_url)
    run_id = store.start_run(PLAN, "test", "cpu")
    barrier = threading.Barrier(16)
    written: list[bool] = []
    errors: list[BaseException] = []

    def write(key: str) -> None:
        try:
            writer = ResultStore(postgres_url)  # its own engine, as a worker process has
            barrier.wait()
            written.append(writer.record_unit(run_id, key, key, _subject(), [_value(1)], "t"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    keys = [f"unit-{i}" for i in range(10)] + ["retried"] * 6
    threads = [threading.Thread(target=write, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sorted(written) == [False] * 5 + [True] * 11
    assert _count(store, "units") == 11
    assert _count(store, "metric_values") == 11
    assert _count(store, "models") == 1 and _count(store, "datasets") == 1
    assert store.finished_units() == {*keys}
    store.finish_run(run_id)


def test_a_failed_unit_is_recorded_with_its_error(postgres_url):
    store = ResultStore(postgres_url)
    run_id = store.start_run(PLAN, "test", "cpu")
    store.record_failure(run_id, "k", "fgsm eps=0.1", "RuntimeError: out of memory")
    assert store.failures(run_id) == [("k", "fgsm eps=0.1", "RuntimeError: out of memory")]
    assert store.finished_units() == set()
    store.finish_run(run_id, "failed")


def test_the_test_server_lives_in_memory_only_where_that_has_room(monkeypatch, tmp_path):
    """testkit/postgres_server.py puts the server's files in /dev/shm (deleting them from
    this machine's disk cost the suite's last test 8-21 s of teardown), else in the
    temporary directory (None): a CI container's small /dev/shm is not filled."""
    import postgres_server

    monkeypatch.setattr(postgres_server, "SHM", tmp_path / "absent")
    assert postgres_server.data_parent() is None
    monkeypatch.setattr(postgres_server, "SHM", tmp_path)
    monkeypatch.setattr(postgres_server, "SHM_ROOM", 0)
    assert postgres_server.data_parent() == str(tmp_path)
    monkeypatch.setattr(postgres_server, "SHM_ROOM", 2**62)  # more than any disk
    assert postgres_server.data_parent() is None
