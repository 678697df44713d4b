"""Opening the results database: an error names what to check, and a PostgreSQL password in
``--db`` never reaches an error or a header: those go into CI logs and PR comments, and the
store's retry warnings into ``run_warnings`` and the report. Until session 21 the errors of
opening the store, of ``report`` and of ``check --baseline`` (and ``evaluate``'s and
``compare``'s header) printed the URL as given, password and all, and a missing driver or a
refused connection was the driver's message alone."""

from __future__ import annotations

import importlib.util

import pytest

from aisafety.check import stored_baseline
from aisafety.errors import ConfigError
from aisafety.report.data import latest_run_id, load_run
from aisafety.store.engine import shown_url
from aisafety.store.results import ResultStore

SECRET = "s3cret-pw"


def with_password(url: str) -> str:
    return url.replace("postgres@", f"postgres:{SECRET}@", 1)


def test_shown_url_masks_the_password_only() -> None:
    url = f"postgresql+psycopg://bob:{SECRET}@db.example.org:5433/results"
    assert shown_url(url) == "postgresql+psycopg://bob:***@db.example.org:5433/results"
    assert shown_url("sqlite:///runs/a.db") == "sqlite:///runs/a.db"
    assert shown_url("sqlite:////tmp/é#1.db") == "sqlite:////tmp/é#1.db"  # not %C3%A9%23
    assert shown_url("not a url") == "not a url"


def test_an_unreachable_server_is_named_without_the_password() -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'psycopg[binary]'")
    with pytest.raises(ConfigError) as caught:
        ResultStore(f"postgresql+psycopg://bob:{SECRET}@127.0.0.1:1/results")
    assert SECRET not in str(caught.value) and "bob:***@127.0.0.1:1" in str(caught.value)
    assert "check --db (host, port, database name" in str(caught.value)  # and the fix


def test_report_and_baseline_errors_hide_the_password(postgres_url) -> None:
    store = ResultStore(with_password(postgres_url))  # trust authentication ignores it
    for error in (
        lambda: latest_run_id(store),
        lambda: load_run(store, 42),
        lambda: stored_baseline("42", store),
    ):
        with pytest.raises(ConfigError) as caught:
            error()
        assert SECRET not in str(caught.value) and "postgres:***@" in str(caught.value)
    store.engine.dispose()


def test_a_missing_driver_names_the_url_that_works() -> None:
    """``postgresql://`` asks SQLAlchemy 2.0 for psycopg2, which the extra does not install."""
    if importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed here")
    with pytest.raises(ConfigError) as caught:
        ResultStore(f"postgresql+psycopg2://bob:{SECRET}@127.0.0.1:1/results")
    assert "write the URL as postgresql+psycopg://" in str(caught.value)
    assert SECRET not in str(caught.value)
