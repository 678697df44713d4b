"""Opening the results database so that concurrent runs and readers cannot corrupt it.

SQLite files run in WAL mode (a reader never blocks a writer, a writer never blocks
readers) with a busy timeout, and writes are retried a bounded number of times when another
process holds the write lock for longer than the timeout. Creating and upgrading the tables
is ``migration.py``'s (Alembic).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from aisafety.errors import AISafetyWarning, ConfigError, StoreError

DEFAULT_GRACE_S = 60.0  # a database server that went away is waited for this long
GRACE_ENV = "AISAFETY_DB_GRACE_S"
GRACE_PAUSE_S = 1.0  # between attempts to reach it again
BUSY_TIMEOUT_S = 30.0  # how long one statement waits for another process's write lock
WRITE_ATTEMPTS = 5  # bounded retries of a whole transaction after that
RETRY_PAUSE_S = 0.5  # first pause between attempts; doubles each time

T = TypeVar("T")

# Errors worth another attempt: a lock held by another process, or a row another process
# created between our check and our insert (a model or dataset row written by a concurrent
# run: the next attempt finds it). Not any "already exists": PostgreSQL says that of every
# duplicate key, which another attempt cannot fix (the tables themselves are created under
# a lock, migration.py).
_TRANSIENT = (
    "locked", "busy", "deadlock", "could not serialize",
    "unique constraint failed: models.", "unique constraint failed: datasets.",
    'unique constraint "models_', 'unique constraint "datasets_',
    # the same unit stored at once by two attempts of one task (Ray retries): the next
    # attempt finds it stored and leaves it
    "unique constraint failed: units.key", 'unique constraint "units_pkey"',
)  # fmt: skip


# A connection that failed or broke: the server restarts, or the network is down.
_GONE = (
    "connection refused", "could not connect", "server closed the connection",
    "terminating connection", "connection is closed", "connection reset",
    "the database system is starting up", "the database system is shutting down",
    "the database system is in recovery mode", "consuming input failed",
    "connection timed out", "no route to host",
)  # fmt: skip


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL, or None for another backend or an in-memory database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser()


def shown_url(url: str) -> str:
    """``url`` with its password masked (``***``): messages, warnings (stored in
    ``run_warnings``, shown by the report) and headers go into CI logs and PR comments."""
    try:
        parsed = make_url(url)
    except (SQLAlchemyError, ValueError):
        return url
    # as given unless there is a password: rendering percent-encodes a path's '#' or 'é',
    # and a hint's --db must name the file the run went to
    return url if parsed.password is None else parsed.render_as_string(hide_password=True)


def check_url(url: str, create: bool) -> None:
    """A clear error for a malformed URL, and for a missing SQLite file unless ``create``."""
    if "://" not in url:
        raise ConfigError(
            f"database URL {url!r} is not a SQLAlchemy URL; use e.g. 'sqlite:///results.db' "
            "or 'postgresql+psycopg://user@host/db'"
        )
    try:
        path = sqlite_file(url)
    except SQLAlchemyError as exc:
        raise ConfigError(f"database URL {url!r} cannot be parsed: {exc}") from None
    if path is None:
        return
    if create:  # ``--db sqlite:///results/run.db`` works without creating results/ first
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the folder of the results database {str(path)!r} (--db {url}): "
                f"{exc.strerror}; give a --db path in a folder you can write"
            ) from None
    elif not path.is_file():
        raise ConfigError(
            f"results database {str(path)!r} does not exist (--db {url}); check the path, "
            "or create it with 'aisafety evaluate --db ...'"
        )


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def open_engine(url: str) -> Engine:
    """An engine for a writable store: WAL and busy timeout on SQLite files."""
    is_sqlite = make_url(url).get_backend_name() == "sqlite"
    connect_args = {"timeout": BUSY_TIMEOUT_S} if is_sqlite else {}
    # a server that restarted leaves dead connections in the pool: test each before use
    engine = create_engine(url, connect_args=connect_args, pool_pre_ping=not is_sqlite)
    if is_sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
        if sqlite_file(url) is not None:  # WAL is a property of the file: set it once
            with_retries(f"open {url}", lambda: _enable_wal(engine))
    return engine


def _enable_wal(engine: Engine) -> None:
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


def checkpoint(engine: Engine) -> None:
    """Copy committed WAL pages into the database file (SQLite), without waiting for readers,
    so that a plain copy of the ``.db`` file taken between units holds every finished unit."""
    if engine.dialect.name == "sqlite" and sqlite_file(str(engine.url)) is not None:
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")


def grace_seconds() -> float:
    """How long a database server that went away is waited for (``AISAFETY_DB_GRACE_S``)."""
    raw = os.environ.get(GRACE_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_GRACE_S
    except ValueError:
        raise ConfigError(f"{GRACE_ENV}={raw!r} is not a number of seconds (e.g. 60)") from None
    if not value >= 0:
        raise ConfigError(f"{GRACE_ENV}={raw!r} must be >= 0 seconds (0: do not wait)")
    return value


def _server_gone(exc: DBAPIError) -> bool:
    """A connection that failed or broke (server restarting, network down), not a refusal
    of the statement itself."""
    text = str(exc.orig).lower()
    return bool(exc.connection_invalidated) or any(word in text for word in _GONE)


def _wait_for_server(what: str, exc: DBAPIError, started: float | None, grace: float) -> float:
    """Start or continue waiting for a server that went away; raise once ``grace`` is over."""
    now = time.monotonic()
    if started is None:
        warnings.warn(
            f"the results database is unreachable ({_first_line(exc)}); waiting up to "
            f"{grace:g} s for it to come back ({GRACE_ENV} sets how long)",
            AISafetyWarning,
            stacklevel=3,
        )
        started = now
    if now - started >= grace:
        raise StoreError(
            f"cannot {what}: {_first_line(exc)} (the database server was unreachable for "
            f"{grace:g} s, the grace period, {GRACE_ENV}); the units finished before are "
            "stored: once the server is back, rerun the same command with --resume"
        ) from None
    time.sleep(min(GRACE_PAUSE_S, grace - (now - started)))
    return started


def _first_line(exc: DBAPIError) -> str:
    return (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]


def with_retries(what: str, action: Callable[[], T]) -> T:
    """Run ``action`` (one whole transaction); retry a few times while the database is busy,
    and for up to ``grace_seconds()`` while its server is unreachable."""
    pause, grace, gone_since = RETRY_PAUSE_S, grace_seconds(), None
    attempt = 0
    while True:
        attempt += 1
        try:
            return action()
        except DBAPIError as exc:
            if _server_gone(exc) and grace > 0:
                gone_since = _wait_for_server(what, exc, gone_since, grace)
                attempt -= 1  # waiting for the server is not an attempt
                continue
            transient = any(word in str(exc.orig).lower() for word in _TRANSIENT)
            if not transient or attempt == WRITE_ATTEMPTS:
                raise StoreError(
                    f"cannot {what}: {exc.orig}"
                    + (
                        f" (still busy after {WRITE_ATTEMPTS} attempts of {BUSY_TIMEOUT_S:g} s; "
                        "another process holds the write lock: stop it, or use a separate --db)"
                        if transient
                        else ""
                    )
                ) from None
        time.sleep(pause)
        pause *= 2
