"""A database server that goes away for less than the grace period is waited for, with a
message, and the run stores exactly what it would have; longer, the run ends with the
original error and --resume advice (issue #35, finding 5). Real PostgreSQL servers, stopped
and started again by the tests (tests/postgres_server.py)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

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


@pytest.fixture
def own_server():
    """A server of this test alone: the others' must not go down with it."""
    from postgres_server import find_bindir, start_postgres

    if find_bindir() is None:
        pytest.skip("PostgreSQL is not installed (initdb not found): apt install postgresql")
    server = start_postgres()
    yield server
    server.stop()


def _units(url: str) -> int:
    with ResultStore(url).engine.connect() as connection:
        return connection.execute(text("SELECT COUNT(*) FROM units")).scalar_one()


def _outage_after_first_unit(server, url: str, down_s: float) -> threading.Thread:
    """Stop the server once the first unit is stored; start it again ``down_s`` later."""

    def outage() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if _units(url) >= 1:
                    break
            except Exception:  # noqa: BLE001 - the tables may not exist yet
                pass
            time.sleep(0.02)
        server.pause()
        time.sleep(down_s)
        server.resume()

    thread = threading.Thread(target=outage, daemon=True)
    thread.start()
    return thread


def test_a_short_outage_is_waited_for_and_changes_nothing(own_server, tmp_path, monkeypatch):
    monkeypatch.setenv("AISAFETY_DB_GRACE_S", "60")
    sqlite_url = f"sqlite:///{tmp_path / 'reference.db'}"
    Runner(PLAN, ResultStore(sqlite_url), quiet=True).run()
    url = own_server.create_database()
    store = ResultStore(url)
    thread = _outage_after_first_unit(own_server, url, down_s=3.0)
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
    grace = 2.0
    monkeypatch.setenv("AISAFETY_DB_GRACE_S", str(grace))
    url = own_server.create_database()
    thread = _outage_after_first_unit(own_server, url, down_s=8.0)
    start = time.monotonic()
    with pytest.warns(AISafetyWarning), pytest.raises(StoreError) as raised:
        Runner(PLAN, ResultStore(url), quiet=True).run()
    message = str(raised.value)
    assert "unreachable for 2 s, the grace period, AISAFETY_DB_GRACE_S" in message
    assert "rerun the same command with --resume" in message
    assert "cannot mark run" not in message  # the original error, not the one of finish_run
    thread.join(60)
    # --resume once it is back computes only what is missing
    record = Runner(PLAN, ResultStore(url), resume=True, quiet=True).run()
    assert record.resumed_units >= 1 and record.failed_units == ()
    assert time.monotonic() - start < 300
