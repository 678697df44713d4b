"""The results store cannot be corrupted: read-only queries, complete units, concurrent
processes, busy locks, and runs that die (docs/reliability.md)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import children
import pytest
from sqlalchemy import text as sa_text
from sqlalchemy.orm import Session

from aisafety.attack.fgsm import FGSM
from aisafety.cli import main
from aisafety.errors import ConfigError, StoreError
from aisafety.interfaces import (
    AttackSpec,
    DatasetSpec,
    EvaluationPlan,
    MetricSpec,
    MetricValue,
    SampleVerdict,
    SmoothingCertificates,
)
from aisafety.runner import Runner
from aisafety.store import engine as store_engine
from aisafety.store import liveness, schema
from aisafety.store.read_only import query_read_only, read_only_engine
from aisafety.store.results import ResultStore

PLAN = EvaluationPlan(
    dataset=DatasetSpec(limit=20),
    attacks=(AttackSpec(name="fgsm", eps=(0.1, 0.3)),),
    metrics=tuple(MetricSpec(name=n) for n in ("ca", "aaw")),
    device="cpu",
)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A database holding one finished run of PLAN (3 units)."""
    path = tmp_path_factory.mktemp("db") / "r.db"
    Runner(PLAN, ResultStore(f"sqlite:///{path}"), quiet=True).run()
    return path


def _count(path, table: str) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


WRITES = [
    "DROP TABLE sample_outcomes",
    "DELETE FROM metric_values",
    "UPDATE runs SET status = 'x'",
    "INSERT INTO runs (id) VALUES (99)",
    "CREATE TABLE t (x)",
    "CREATE TEMP TABLE t (x)",
    "DROP VIEW results",
    "ALTER TABLE runs ADD COLUMN y",
    "ATTACH '{dir}/attached.db' AS other",
    "VACUUM INTO '{dir}/copy.db'",
    "VACUUM",
    "PRAGMA journal_mode=DELETE",
    "PRAGMA user_version=5",
    "BEGIN",
    "REINDEX",
]


@pytest.mark.parametrize("sql", WRITES)
def test_query_refuses_every_write(filled, sql, capsys):
    before = {t: _count(filled, t) for t in ("runs", "metric_values", "sample_outcomes")}
    statement = sql.format(dir=filled.parent)
    assert main(["query", "--db", f"sqlite:///{filled}", statement]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query refused:") and "read-only" in err
    assert "Traceback" not in err
    assert {t: _count(filled, t) for t in before} == before
    assert not (filled.parent / "copy.db").exists()
    assert not (filled.parent / "attached.db").exists()


# where the server would write a COPY: a name of this run's own, so a file left in /tmp by an
# earlier run (or another run beside this one) cannot fail the check that none was written
COPIED = f"/tmp/aisafety-copied-runs-{uuid.uuid4().hex}.csv"
PG_WRITES = [
    "DROP TABLE sample_outcomes",
    "DELETE FROM metric_values",
    "UPDATE runs SET status = 'x'",
    "INSERT INTO runs (id) VALUES (99)",
    "CREATE TABLE t (x int)",
    "CREATE TEMP TABLE t (x int)",
    "DROP VIEW results",
    "ALTER TABLE runs ADD COLUMN y int",
    "WITH gone AS (DELETE FROM units RETURNING key) SELECT * FROM gone",
    pytest.param(f"COPY runs TO '{COPIED}'", id="COPY runs TO a file"),  # the same id each run
    "TRUNCATE units CASCADE",
    "SELECT 1; DELETE FROM units",
    "SET TRANSACTION READ WRITE",
]


@pytest.fixture(scope="module")
def filled_postgres(postgres_server) -> str:
    """A PostgreSQL database holding one finished run of PLAN (3 units)."""
    url = postgres_server.create_database()
    Runner(PLAN, ResultStore(url), quiet=True).run()
    return url


@pytest.mark.parametrize("sql", PG_WRITES)
def test_query_refuses_every_write_on_postgresql(filled_postgres, sql, capsys):
    store = ResultStore(filled_postgres)
    tables = ("runs", "units", "metric_values", "sample_outcomes")
    before = {t: _count_url(store, t) for t in tables}
    assert main(["query", "--db", filled_postgres, sql]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query refused:"), err
    assert "Traceback" not in err
    assert {t: _count_url(store, t) for t in tables} == before
    assert len(store.finished_units()) == 3
    assert not os.path.exists(COPIED)


def test_query_reads_on_postgresql(filled_postgres, capsys):
    assert main(["query", "--db", filled_postgres, "SELECT status FROM runs"]) == 0
    assert "finished" in capsys.readouterr().out


def test_a_unit_committed_twice_by_one_run_is_stored_once(store_url):
    """Idempotent unit commits: a retried write of a unit this run stored is a no-op."""
    store = ResultStore(store_url)
    run_id = store.start_run(PLAN, "test", "cpu")
    value = MetricValue(metric="ca", value=0.5, direction="higher", n_samples=2)
    assert store.record_unit(run_id, "k", "unit", _subject(), [value], "test") is True
    assert store.record_unit(run_id, "k", "unit", _subject(), [value], "test") is False
    assert _count_url(store, "units") == 1 and _count_url(store, "metric_values") == 1
    assert store.finished_units() == {"k"}
    store.finish_run(run_id)


def test_per_sample_values_of_a_metric_without_certificates_are_read_back(store_url):
    """AH's per-sample areas stay in the value's JSON (``aisafety compare --resume`` runs its
    rank-sum test on them); a smoothed metric's per_sample goes to its certificate rows."""
    store = ResultStore(store_url)
    run_id = store.start_run(PLAN, "test", "cpu")
    areas = [0.25, 0.0, 0.5]
    value = MetricValue(metric="adversarial-hypervolume", value=0.25, direction="higher",
                        n_samples=3, details={"std": 0.2, "per_sample": areas})  # fmt: skip
    store.record_unit(run_id, "ah", "unit", _subject(), [value], "test")
    (stored,) = store.unit_values("ah")
    assert stored.details == {"std": 0.2, "per_sample": areas}
    store.finish_run(run_id)


def test_query_reads_and_store_query_is_read_only_too(filled):
    columns, rows = query_read_only(read_only_engine(f"sqlite:///{filled}"), "SELECT * FROM runs")
    assert "status" in columns and len(rows) == 1
    _, info = query_read_only(read_only_engine(f"sqlite:///{filled}"), "PRAGMA table_info(units)")
    assert {"n_values", "n_outcomes"} <= {row[1] for row in info}
    store = ResultStore(f"sqlite:///{filled}")
    with pytest.raises(ConfigError, match="refused"):
        store.query("DELETE FROM units")
    store.query("SELECT 1")  # the authorizer is removed again: the store still writes
    assert _count(filled, "units") == 3


def test_missing_database_is_an_error_for_query(tmp_path, capsys):
    missing = tmp_path / "typo.db"
    assert main(["query", "--db", f"sqlite:///{missing}", "SELECT 1"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not missing.exists()
    with pytest.raises(ConfigError, match="does not exist"):
        ResultStore(f"sqlite:///{missing}", create=False)


def test_units_with_missing_rows_are_not_finished(tmp_path):
    """Emptying a table (what DROP TABLE + re-creation leaves) makes the units run again."""
    path = tmp_path / "r.db"
    store = ResultStore(f"sqlite:///{path}")
    first = Runner(PLAN, store, quiet=True).run()
    assert len(store.finished_units()) == 3
    with sqlite3.connect(path) as connection:
        connection.execute("DELETE FROM sample_outcomes WHERE attack_run_id = 1")
    assert len(store.finished_units()) == 2
    with sqlite3.connect(path) as connection:
        connection.execute("DELETE FROM metric_values WHERE metric = 'ca'")
    assert len(store.finished_units()) == 1
    again = Runner(PLAN, store, resume=True, quiet=True).run()
    assert again.resumed_units == 1
    assert [v.value for v in again.values] == [v.value for v in first.values]
    assert len(store.finished_units()) == 3


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """A fresh, empty database: a SQLite file, then one on the tests' PostgreSQL server."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_url")
    return f"sqlite:///{tmp_path / 'r.db'}"


def _execute(store: ResultStore, sql: str) -> None:
    """A write behind the store's back (a user's own client)."""
    with store.engine.begin() as connection:
        connection.execute(sa_text(sql))


def _full_unit(zoo_predictor, x, y) -> tuple[list[MetricValue], tuple]:
    """Metric values and an attack result that fill every table a unit writes: values,
    per-sample outcomes, example images, verification verdicts, smoothing certificates."""
    result = FGSM()(zoo_predictor, x, y, 0.1)
    n = len(y)
    verdicts = [
        SampleVerdict(sample_index=i, label=int(y[i]), verdict="unknown", margin=None,
                      seconds=0.0)
        for i in range(n)
    ]  # fmt: skip
    certificates = SmoothingCertificates(
        setting="k", norm="l2", sample_index=list(range(n)), label=y.tolist(),
        prediction=y.tolist(), p_a_lower=[0.9] * n, radius=[0.5] * n, seconds=[0.0] * n,
    )  # fmt: skip
    values = [
        MetricValue(metric="certified", value=0.5, direction="higher", n_samples=n,
                    verdicts=verdicts),
        MetricValue(metric="smoothed", value=0.5, direction="higher", n_samples=n,
                    details={"certificates": "k", "norm": "l2"},
                    smoothing_certificates=certificates),
    ]  # fmt: skip
    return values, (AttackSpec(name="fgsm", eps=(0.1,)), "gradient", result)


# every table a unit writes rows to, and SQL deleting one of those rows
ROW_TABLES = {
    "metric_values": "DELETE FROM metric_values WHERE metric = 'smoothed'",
    "sample_outcomes": "DELETE FROM sample_outcomes WHERE sample_index = 2",
    "example_images": "DELETE FROM example_images WHERE sample_index = "
    "(SELECT MIN(sample_index) FROM example_images)",
    "verification_samples": "DELETE FROM verification_samples WHERE sample_index = 1",
    "smoothing_certificates": "DELETE FROM smoothing_certificates WHERE sample_index = 0",
}


@pytest.mark.parametrize("table", ROW_TABLES)
def test_a_unit_missing_a_row_of_any_table_is_not_finished(
    store_url, table, zoo_predictor, mnist_subset
):
    data = mnist_subset(6, seed=3)
    values, attack = _full_unit(zoo_predictor, data.x, data.y)
    store = ResultStore(store_url)
    run_id = store.start_run(PLAN, "test", "cpu")
    store.record_unit(run_id, "full", "unit", _subject(), values, "test", attack)
    store.record_unit(run_id, "other", "unit", _subject(), values, "test", attack)
    assert store.finished_units() == {"full", "other"}
    for counted in ROW_TABLES:
        assert _count_url(store, counted) > 0, counted
    _execute(store, ROW_TABLES[table] + " AND " + _of_unit(table, "full"))
    assert store.finished_units() == {"other"}
    # the unit written again (what --resume does for it) counts as finished again
    again = store.start_run(PLAN, "test", "cpu")
    store.record_unit(again, "full", "unit", _subject(), values, "test", attack)
    assert store.finished_units() == {"full", "other"}
    store.finish_run(run_id)
    store.finish_run(again)


def _of_unit(table: str, key: str) -> str:
    """SQL restricting ``table``'s rows to those of unit ``key``."""
    if table in ("metric_values", "smoothing_certificates"):
        return f"unit_key = '{key}'"
    if table == "verification_samples":
        return f"metric_value_id IN (SELECT id FROM metric_values WHERE unit_key = '{key}')"
    return f"attack_run_id IN (SELECT id FROM attack_runs WHERE unit_key = '{key}')"


def _count_url(store: ResultStore, table: str) -> int:
    with store.engine.connect() as connection:
        return connection.execute(sa_text(f"SELECT COUNT(*) FROM {table}")).scalar_one()


def _open_store(url: str, barrier) -> None:
    barrier.wait()
    ResultStore(url)


def test_concurrent_processes_create_the_schema_on_a_fresh_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(5)
    workers = [context.Process(target=_open_store, args=(url, barrier)) for _ in range(5)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0] * 5


def _write_units(url: str, barrier, worker: int) -> None:
    barrier.wait()
    store = ResultStore(url)
    plan = PLAN.model_copy(update={"seed": worker})
    run_id = store.start_run(plan, "test", "cpu")
    for unit in range(20):
        store.record_unit(run_id, f"{worker}-{unit}", "unit", _subject(), [], "test")
    store.finish_run(run_id)


def _subject():
    from aisafety.store.results import Subject

    return Subject("m", "f" * 16, {}, "labels", "d", "test", 1, "g" * 16, {})


def test_concurrent_writers_all_commit(store_url):
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(5)
    workers = [
        context.Process(target=_write_units, args=(store_url, barrier, w)) for w in range(5)
    ]  # fmt: skip
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0] * 5
    store = ResultStore(store_url)
    assert _count_url(store, "units") == 100
    assert len(store.finished_units()) == 100


def test_a_long_reader_does_not_stop_a_run(tmp_path):
    path = tmp_path / "r.db"
    store = ResultStore(f"sqlite:///{path}")
    reader = sqlite3.connect(path)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM runs").fetchone()  # holds a read snapshot
    try:
        record = Runner(PLAN, store, quiet=True).run()
    finally:
        reader.close()
    assert len(record.values) == 3 and len(store.finished_units()) == 3


def test_a_held_write_lock_is_waited_for_then_reported(tmp_path, monkeypatch):
    path = tmp_path / "r.db"
    monkeypatch.setattr(store_engine, "BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(store_engine, "RETRY_PAUSE_S", 0.05)
    store = ResultStore(f"sqlite:///{path}")
    run_id = store.start_run(PLAN, "test", "cpu")
    locker = sqlite3.connect(path, check_same_thread=False)
    locker.execute("BEGIN IMMEDIATE")  # another process's write transaction
    threading.Timer(0.3, locker.rollback).start()  # released within the retries
    store.record_unit(run_id, "a", "unit", _subject(), [], "test")
    locker.execute("BEGIN IMMEDIATE")  # never released while we try
    try:
        with pytest.raises(StoreError, match="still busy after 5 attempts"):
            store.record_unit(run_id, "b", "unit", _subject(), [], "test")
    finally:
        locker.rollback()
        locker.close()
    assert store.finished_units() == {"a"}
    store.finish_run(run_id)


def test_a_killed_run_is_marked_interrupted_by_the_next_run(tmp_path):
    path = tmp_path / "r.db"
    store = ResultStore(f"sqlite:///{path}")
    dead = children.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    run_id = store.start_run(PLAN, "test", "cpu")
    with sqlite3.connect(path) as connection:  # as a kill -9 leaves it
        connection.execute("UPDATE runs SET pid = ? WHERE id = ?", (int(dead.stdout), run_id))
    store._heartbeats.pop(run_id).stop()  # a killed process beats no more
    alive = store.start_run(PLAN, "test", "cpu")  # this process: still running
    last = store.start_run(PLAN, "test", "cpu")
    _, rows = store.query("SELECT id, status FROM runs ORDER BY id")
    assert rows == [(run_id, "interrupted"), (alive, "running"), (last, "running")]
    assert last == alive + 1
    store.finish_run(alive)
    store.finish_run(last)


CHILD = """
import sys, torch
torch.set_num_threads(1)
from aisafety.store.results import ResultStore
from aisafety.interfaces import EvaluationPlan
from aisafety.runner import Runner
plan = EvaluationPlan.model_validate_json(sys.argv[2])
Runner(plan, ResultStore(sys.argv[1]), quiet=True).run()
"""


def test_sigterm_marks_the_run_interrupted(tmp_path):
    path = tmp_path / "r.db"
    many = tuple(round(0.01 * i, 2) for i in range(1, 40))  # more units than it has time for
    plan = PLAN.model_copy(update={"attacks": (AttackSpec(name="fgsm", eps=many),)})
    child = children.start(
        [sys.executable, "-c", CHILD, f"sqlite:///{path}", plan.model_dump_json()],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + children.HANG_LIMIT  # a hang guard: waits for a unit, not time
    while time.monotonic() < deadline and not _units_done(path) and child.poll() is None:
        time.sleep(0.05)
    assert _units_done(path), "the child wrote no unit before it ended or the hang guard"
    child.send_signal(signal.SIGTERM)
    _, err = children.communicate(child, what="the SIGTERMed run")
    assert child.returncode != 0, err
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]


def _units_done(path) -> int:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            return connection.execute("SELECT COUNT(*) FROM units").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_an_old_database_gets_the_new_columns(tmp_path):
    path = tmp_path / "old.db"
    ResultStore(f"sqlite:///{path}")
    with sqlite3.connect(path) as connection:  # as made before the columns (and Alembic)
        for table, column in (("units", "n_values"), ("units", "n_outcomes"), ("runs", "pid")):
            connection.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        connection.execute("DROP TABLE alembic_version")
    store = ResultStore(f"sqlite:///{path}")
    record = Runner(PLAN, store, quiet=True).run()
    assert len(store.finished_units()) == 3 and len(record.values) == 3


def test_a_run_that_died_on_another_host_is_marked_when_its_lease_runs_out(store_url):
    """No pid can be checked across hosts: a run whose heartbeat is older than the lease
    (STALE_AFTER_S) is marked interrupted by the next run that starts, on any host; one
    whose heartbeat is fresh is left running."""
    store = ResultStore(store_url)
    stale, fresh, legacy = (store.start_run(PLAN, "test", "cpu") for _ in range(3))
    for run_id in (stale, fresh, legacy):
        store._heartbeats.pop(run_id).stop()  # as if these ran elsewhere
    long_ago = liveness.utc_now() - timedelta(seconds=liveness.STALE_AFTER_S + 60)
    recent = liveness.utc_now() - timedelta(seconds=liveness.STALE_AFTER_S - 60)
    with Session(store.engine) as session, session.begin():
        for run_id, beat in ((stale, long_ago), (fresh, recent), (legacy, None)):
            run = session.get(schema.Run, run_id)
            run.host, run.pid, run.heartbeat_at = "another-host", 1, beat
    mine = store.start_run(PLAN, "test", "cpu")
    _, rows = store.query("SELECT id, status FROM runs ORDER BY id")
    assert rows == [(stale, "interrupted"), (fresh, "running"), (legacy, "running"),
                    (mine, "running")]  # fmt: skip
    store.finish_run(mine)


def test_a_running_run_renews_its_lease_until_it_ends(store_url, monkeypatch):
    monkeypatch.setattr(liveness, "HEARTBEAT_S", 0.05)
    store = ResultStore(store_url)
    run_id = store.start_run(PLAN, "test", "cpu")

    def heartbeat():
        return store.query(f"SELECT heartbeat_at FROM runs WHERE id = {run_id}")[1][0][0]

    first = heartbeat()
    deadline = time.monotonic() + 30
    while heartbeat() == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert heartbeat() != first  # renewed by the background thread
    thread = store._heartbeats[run_id]._thread
    store.finish_run(run_id)
    assert not thread.is_alive()
    ended = heartbeat()
    time.sleep(0.3)
    assert heartbeat() == ended  # a finished run holds no lease


def test_a_duplicate_key_is_reported_at_once_not_retried_as_busy(monkeypatch):
    """PostgreSQL ends every duplicate-key message with 'already exists': a key no retry can
    fix is an error at once, not 'still busy after 5 attempts'."""
    from sqlalchemy.exc import IntegrityError

    monkeypatch.setattr(store_engine, "RETRY_PAUSE_S", 0.0)
    calls = []

    def insert() -> None:
        calls.append(1)
        raise IntegrityError(
            "INSERT", {}, Exception('duplicate key value violates unique constraint '
                                    '"metric_values_pkey"\nDETAIL:  Key (id)=(3) already exists.'),
        )  # fmt: skip

    with pytest.raises(StoreError, match="metric_values_pkey") as error:
        store_engine.with_retries("store a unit", insert)
    assert len(calls) == 1 and "busy" not in str(error.value)
