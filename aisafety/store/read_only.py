"""``aisafety query``: SQL against the results database that cannot change anything.

Read-only by construction, not by parsing the text:

* one statement per call: SQLite's driver refuses a second statement, and on PostgreSQL
  the statement goes through the extended protocol (one prepared statement), which the
  server itself refuses for more than one command, so ``SELECT 1; COMMIT; DROP ...`` never
  runs its ``COMMIT``;
* SQLite files are opened with ``mode=ro``, and an authorizer allows only reading (SELECT,
  reading columns, functions, recursive CTEs, read-only PRAGMAs): ``mode=ro`` alone lets
  ``ATTACH`` and ``VACUUM INTO`` create other files;
* PostgreSQL sessions start with ``default_transaction_read_only=on`` and every statement
  runs in a ``READ ONLY`` transaction that is rolled back; a single statement cannot make
  its own transaction read-write (the server refuses it after the first query);
* a statement timeout (PostgreSQL's ``statement_timeout``, SQLite's progress handler) and a
  row limit bound what one call costs, and rows are streamed, never collected whole.

What a PostgreSQL role may still *read* (server files, for a superuser) is the role's
business: docs/database.md says which role to give ``query``.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from aisafety.errors import ConfigError
from aisafety.store import QUERY_MAX_ROWS, QUERY_TIMEOUT_S
from aisafety.store.engine import check_url, shown_url, sqlite_file


@dataclass(frozen=True)
class QueryLimits:
    """What one query may cost: seconds until it is stopped, rows until output stops
    (``None``: no row limit, for callers that collect a known small result)."""

    timeout_s: float = QUERY_TIMEOUT_S
    max_rows: int | None = QUERY_MAX_ROWS

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"query timeout {self.timeout_s} s must be > 0 (e.g. --timeout 60)")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"query row limit {self.max_rows} must be >= 1 (e.g. --max-rows 100)")


_READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}
_READ_PRAGMAS = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "database_list", "collation_list", "function_list", "compile_options",
}  # fmt: skip
_CATALOGUE_WRITES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_ACTION_NAMES = {
    sqlite3.SQLITE_ATTACH: "ATTACH (or VACUUM, which attaches its output file)",
    sqlite3.SQLITE_DETACH: "DETACH",
    sqlite3.SQLITE_INSERT: "INSERT",
    sqlite3.SQLITE_UPDATE: "UPDATE",
    sqlite3.SQLITE_DELETE: "DELETE",
    sqlite3.SQLITE_DROP_TABLE: "DROP TABLE",
    sqlite3.SQLITE_DROP_VIEW: "DROP VIEW",
    sqlite3.SQLITE_DROP_INDEX: "DROP INDEX",
    sqlite3.SQLITE_CREATE_TABLE: "CREATE TABLE",
    sqlite3.SQLITE_CREATE_TEMP_TABLE: "CREATE TEMP TABLE",
    sqlite3.SQLITE_CREATE_VIEW: "CREATE VIEW",
    sqlite3.SQLITE_CREATE_INDEX: "CREATE INDEX",
    sqlite3.SQLITE_ALTER_TABLE: "ALTER TABLE",
    sqlite3.SQLITE_TRANSACTION: "a transaction (BEGIN/COMMIT)",
    sqlite3.SQLITE_PRAGMA: "a PRAGMA that sets a value",
    sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT",
    sqlite3.SQLITE_REINDEX: "REINDEX",
    sqlite3.SQLITE_ANALYZE: "ANALYZE",
}


class _Authorizer:
    """SQLite authorizer callback that allows reading only and remembers what it refused."""

    def __init__(self) -> None:
        self.actions: list[tuple[int, str]] = []

    def __call__(self, action: int, arg1, arg2, _db, _trigger) -> int:
        if action in _READ_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and str(arg1).lower() in _READ_PRAGMAS:
            return sqlite3.SQLITE_OK
        self.actions.append((action, str(arg1)))
        return sqlite3.SQLITE_DENY

    @property
    def refused(self) -> str | None:
        """What the statement tried; DROP/CREATE first write the catalogue (sqlite_master),
        so a write to the catalogue is named only when nothing more telling was refused."""
        telling = [
            a for a, arg in self.actions
            if not (a in _CATALOGUE_WRITES and arg.startswith("sqlite_"))
        ]  # fmt: skip
        if telling:
            return _ACTION_NAMES.get(telling[0], f"SQLite action {telling[0]}")
        return "DROP or CREATE (a change to the schema)" if self.actions else None


def read_only_engine(url: str) -> Engine:
    """An engine on an existing database: SQLite files opened read-only, PostgreSQL
    sessions read-only from their start (``default_transaction_read_only``)."""
    check_url(url, create=False)
    path = sqlite_file(url)
    if path is not None:
        url = f"sqlite:///file:{quote(str(path.resolve()))}?mode=ro&uri=true"
    backend = make_url(url).get_backend_name()
    connect_args = {}
    if backend == "postgresql":
        _check_psycopg3(url)
        connect_args = {"options": "-c default_transaction_read_only=on"}
    try:
        return create_engine(url, connect_args=connect_args)
    except (SQLAlchemyError, ImportError) as exc:
        shown = shown_url(url)
        raise ConfigError(f"cannot open the results database {shown!r}: {exc}") from None


def _check_psycopg3(url: str) -> None:
    driver = make_url(url).get_driver_name()
    if driver != "psycopg":
        raise ConfigError(
            f"'aisafety query' on PostgreSQL needs the psycopg (3) driver, not {driver!r}: "
            f"write the URL as postgresql+psycopg://... (pip install 'psycopg[binary]')"
        )


class Rows:
    """The columns and a one-pass iterator over the rows of a read-only query;
    ``truncated`` is True once iteration stopped at the row limit."""

    def __init__(self, columns: list[str], rows: Iterator[tuple], limits: QueryLimits) -> None:
        self.columns = columns
        self.truncated = False
        self._rows = rows
        self._limits = limits

    def __iter__(self) -> Iterator[tuple]:
        for count, row in enumerate(self._rows, start=1):
            yield row
            if self._limits.max_rows is not None and count >= self._limits.max_rows:
                self.truncated = next(self._rows, None) is not None
                return


@contextmanager
def read_only_rows(engine: Engine, sql: str, limits: QueryLimits | None = None) -> Iterator[Rows]:
    """The rows of ``sql``, streamed; any statement that would write is refused, and errors
    (while executing or iterating) are ``ConfigError`` naming the cause and the fix."""
    limits = limits or QueryLimits()
    backend = make_url(str(engine.url)).get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"read-only queries are supported on SQLite and PostgreSQL, not {backend!r}"
        )
    connection = _connected(engine)
    try:
        with connection:
            if backend == "sqlite":
                with _sqlite_rows(connection, sql, limits) as rows:
                    yield rows
            else:
                with _postgresql_rows(connection, sql, limits) as rows:
                    yield rows
    except (SQLAlchemyError, sqlite3.Error) as exc:
        raise _query_error(exc, limits) from None
    except Exception as exc:  # psycopg's own errors, raised while streaming
        if type(exc).__module__.startswith("psycopg"):
            raise _query_error(exc, limits) from None
        raise


def query_read_only(
    engine: Engine, sql: str, limits: QueryLimits | None = None
) -> tuple[list[str], list[tuple]]:
    """Column names and rows of ``sql`` (no row limit unless ``limits`` sets one)."""
    with read_only_rows(engine, sql, limits or QueryLimits(max_rows=None)) as rows:
        return rows.columns, list(rows)


_READ_ONLY_HINT = "'aisafety query' is read-only (SELECT, WITH, read-only PRAGMAs)"
# A READ ONLY transaction still lets COPY ... TO write a file on the server; a statement
# other than these is refused before it is sent.
_PG_READING = re.compile(
    r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*(select|with|values|table|show|explain)\b",
    re.IGNORECASE | re.DOTALL,
)


def _connected(engine: Engine) -> Connection:
    """A connection, or an error naming the server and the fix: a refused connection is no
    fault of the statement (before session 21 it was said with the hint 'one SQL statement
    per query')."""
    try:
        return engine.connect()
    except SQLAlchemyError as exc:
        message = str(getattr(exc, "orig", None) or exc).strip()
        raise ConfigError(
            f"cannot connect to the results database {shown_url(str(engine.url))}: {message}; "
            "check --db (host, port, database name, user, password) and that the server runs"
        ) from None


def _query_error(exc: BaseException, limits: QueryLimits) -> ConfigError:
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).strip()
    if "read-only transaction" in message:
        return ConfigError(f"query refused: {message}; {_READ_ONLY_HINT}")
    if "multiple commands" in message or "one statement at a time" in message:
        return ConfigError(
            f"query refused: {message}: 'aisafety query' runs exactly one SQL statement per "
            "call; run each statement in its own call"
        )
    if "statement timeout" in message or message == "interrupted":
        return ConfigError(
            f"query stopped after its timeout of {limits.timeout_s:g} s (--timeout); give a "
            "larger --timeout, or narrow the query (WHERE, LIMIT)"
        )
    return ConfigError(
        f"query failed: {message} (one SQL statement per query; tables and views: see "
        "docs/database.md)"
    )


def _check_postgresql_statement(sql: str) -> None:
    if not _PG_READING.match(sql):
        first = sql.strip().split(None, 1)[0] if sql.strip() else "(empty)"
        raise ConfigError(f"query refused: {first} is not a reading statement; {_READ_ONLY_HINT}")


@contextmanager
def _postgresql_rows(connection: Connection, sql: str, limits: QueryLimits) -> Iterator[Rows]:
    """One statement through psycopg's ``stream`` (extended protocol, single-row mode)
    in a READ ONLY transaction with ``statement_timeout``; rolled back on leaving."""
    _check_postgresql_statement(sql)
    _check_psycopg3(str(connection.engine.url))
    raw = connection.connection.dbapi_connection
    timeout_ms = max(1, round(limits.timeout_s * 1000))
    with raw.cursor() as cursor:
        cursor.execute("SET TRANSACTION READ ONLY")
        cursor.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
        stream = cursor.stream(sql)
        try:
            first = next(stream, None)
            columns = [d.name for d in cursor.description or []]
            rows = _chain_first(first, stream) if first is not None else iter(())
            yield Rows(columns, rows, limits)
        finally:
            stream.close()  # cancels a statement still sending rows
            raw.rollback()


def _chain_first(first: tuple, rest: Iterator[tuple]) -> Iterator[tuple]:
    yield first
    yield from rest


@contextmanager
def _sqlite_rows(connection: Connection, sql: str, limits: QueryLimits) -> Iterator[Rows]:
    raw = connection.connection.dbapi_connection
    authorizer = _Authorizer()
    deadline = time.monotonic() + limits.timeout_s
    raw.set_authorizer(authorizer)
    raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cursor = raw.cursor()
        cursor.execute(sql)
        columns = [d[0] for d in cursor.description or []]
        yield Rows(columns, iter(cursor), limits)
    except sqlite3.Error:
        if authorizer.refused is not None:
            raise ConfigError(
                f"query refused: {authorizer.refused} would change the database or write a "
                f"file; {_READ_ONLY_HINT}"
            ) from None
        raise
    finally:
        raw.set_authorizer(None)  # the connection goes back to a pool a writer may use
        raw.set_progress_handler(None, 0)


def superuser_warning(engine: Engine) -> str | None:
    """A warning when a PostgreSQL query runs as a superuser, which a read-only transaction
    does not stop from reading the server's files (``pg_read_file``, ``pg_ls_dir``)."""
    if make_url(str(engine.url)).get_backend_name() != "postgresql":
        return None
    try:
        with engine.connect() as connection:
            user, superuser = connection.exec_driver_sql(
                "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
            ).one()
    except SQLAlchemyError as exc:
        raise _query_error(exc, QueryLimits()) from None
    if not superuser:
        return None
    return (
        f"'aisafety query' connected as the PostgreSQL superuser {user!r}: a read-only "
        "transaction stops writes, not a superuser reading the server's files; give query a "
        "role with SELECT on the results tables only (docs/database.md)"
    )
