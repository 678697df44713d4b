"""A database server that goes away for less than the grace period is waited for, with a
message, and the run stores exactly what it would have; longer, the run ends with the
original error and --resume advice (issue #35, finding 5). Real PostgreSQL servers, stopped
and started again by the tests (testkit/postgres_server.py)."""

from __future__ import annotations

import threading
import time

import pytest

from aisafety.errors import AISafetyWarning, StoreError
from aisafety.interfaces import EvaluationPlan
from aisafety.runner import Runner
from aisafety.store.compare import compare
from aisafety.store.results import ResultStore

pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'psycopg[binary]'")

PLAN = EvaluationPlan.model_validate(
    {"dataset": {"limit": 16}, "attacks": [{"name": "fgsm", "eps": [0.1, 0.2, 0.3]}],
     "metrics": ["ca", "aaw"], "device": "cpu"}
)  # fmt: skip


@pytest.fixture(scope="module")
def own_server():
    """A server of this module alone: the others' must not go down with it. Shared by its
    two tests (one start and stop fewer, ~1 s): each ends with the server back up."""
    from postgres_server import find_bindir, start_postgres

    if find_bindir() is None:
        pytest.skip("PostgreSQL is not installed (initdb not found): apt install postgresql")
    server = start_postgres()
    yield server
    server.stop()


def _outage_after_first_unit(
    server, store: ResultStore, monkeypatch, down_s: float, back: threading.Event | None = None
):
    """Stop the server as soon as ``store`` has written the run's first unit, in the run's
    own thread (the next write finds it down), and start it again ``down_s`` later, or once
    ``back`` is set, from a thread, which is returned. A thread polling for the first unit
    raced the run: its other units took 0.2-0.3 s, and a stop that came later found nothing
    left to wait for (no warning; the fixture's teardown then stopped the server under the
    thread's pg_ctl)."""
    record_unit = store.record_unit
    back = back or threading.Event()
    resume = threading.Thread(target=lambda: (back.wait(down_s), server.resume()), daemon=True)

    def record_then_stop(*args, **kwargs):
        written = record_unit(*args, **kwargs)
        if resume.ident is None:  # the first unit: not started yet
            server.pause()
            resume.start()
        return written

    monkeypatch.setattr(store, "record_unit", record_then_stop)
    return resume


def test_a_short_outage_is_waited_for_and_changes_nothing(own_server, tmp_path, monkeypatch):
    monkeypatch.setenv("AISAFETY_DB_GRACE_S", "60")
    sqlite_url = f"sqlite:///{tmp_path / 'reference.db'}"
    Runner(PLAN, ResultStore(sqlite_url), quiet=True).run()
    url = own_server.create_database()
    store = ResultStore(url)
    # 1 s: the write after the first unit finds it down whatever the length (3 s before)
    thread = _outage_after_first_unit(own_server, store, monkeypatch, down_s=1.0)
    with pytest.warns(
        AISafetyWarning, match="results database is unreachable .* waiting up to 60 s"
    ):
        record = Runner(PLAN, store, quiet=True).run()
    thread.join(60)
    assert record.failed_units == ()
    _, differences = compare(sqlite_url, url)
    assert differences == []
    assert store.query("SELECT status FROM runs")[1] == [("finished",)]


def test_an_outage_longer_than_the_grace_ends_the_run_with_the_original_error(
    own_server, monkeypatch
):
    grace = 1.0  # the run gives up after it: its length is not what is checked (2 s before)
    monkeypatch.setenv("AISAFETY_DB_GRACE_S", str(grace))
    url = own_server.create_database()
    store = ResultStore(url)
    # down until the run has given up (at most 60 s), so longer than the grace by
    # construction: a fixed 8 s outage kept the test waiting ~5 s after the run had ended
    back = threading.Event()
    thread = _outage_after_first_unit(own_server, store, monkeypatch, down_s=60.0, back=back)
    start = time.monotonic()
    with pytest.warns(AISafetyWarning), pytest.raises(StoreError) as raised:
        Runner(PLAN, store, quiet=True).run()
    back.set()
    message = str(raised.value)
    assert "unreachable for 1 s, the grace period, AISAFETY_DB_GRACE_S" in message
    assert "rerun the same command with --resume" in message
    assert "cannot mark run" not in message  # the original error, not the one of finish_run
    thread.join(60)
    # --resume once it is back computes only what is missing
    record = Runner(PLAN, ResultStore(url), resume=True, quiet=True).run()
    assert record.resumed_units >= 1 and record.failed_units == ()
    assert time.monotonic() - start < 300
