"""Opening the results database so that concurrent runs and readers cannot corrupt it.

SQLite files run in WAL mode (a reader never blocks a writer, a writer never blocks
readers) with a busy timeout, and writes are retried a bounded number of times when another
process holds the write lock for longer than the timeout. Creating and upgrading the tables
is ``migration.py``'s (Alembic).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from aisafety.errors import ConfigError, StoreError

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


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL, or None for another backend or an in-memory database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser()


def check_url(url: str, create: bool) -> None:
    """A clear error for a malformed URL, and for a missing SQLite file unless ``create``."""
    if "://" not in url:
        raise ConfigError(
            f"database URL {url!r} is not a SQLAlchemy URL; use e.g. 'sqlite:///results.db' "
            "or 'postgresql://user@host/db'"
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
    engine = create_engine(url, connect_args=connect_args)
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


def with_retries(what: str, action: Callable[[], T]) -> T:
    """Run ``action`` (one whole transaction); retry a few times while the database is busy."""
    pause = RETRY_PAUSE_S
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            return action()
        except DBAPIError as exc:
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
    raise AssertionError("unreachable")
