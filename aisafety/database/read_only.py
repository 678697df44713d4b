"""``aisafety query``: SQL against the results database that cannot change anything.

SQLite files are opened with ``mode=ro``, which stops writes to the database itself but
not ``ATTACH`` or ``VACUUM INTO`` (they create other files), so an authorizer also allows
only reading: SELECT, reading columns, functions, recursive CTEs and read-only PRAGMAs.
PostgreSQL runs the statement in a READ ONLY transaction that is rolled back.
"""

from __future__ import annotations

import re
import sqlite3
from urllib.parse import quote

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from aisafety.database.engine import check_url, sqlite_file
from aisafety.errors import ConfigError

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
    """An engine on an existing database that opens SQLite files read-only."""
    check_url(url, create=False)
    path = sqlite_file(url)
    if path is not None:
        url = f"sqlite:///file:{quote(str(path.resolve()))}?mode=ro&uri=true"
    try:
        return create_engine(url)
    except (SQLAlchemyError, ImportError) as exc:
        raise ConfigError(f"cannot open the results database {url!r}: {exc}") from None


def query_read_only(engine: Engine, sql: str) -> tuple[list[str], list[tuple]]:
    """Column names and rows of ``sql``; any statement that would write is refused."""
    backend = make_url(str(engine.url)).get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"read-only queries are supported on SQLite and PostgreSQL, not {backend!r}"
        )
    try:
        with engine.connect() as connection:
            if backend == "sqlite":
                return _sqlite_query(connection, sql)
            _check_postgresql_statement(sql)
            connection.exec_driver_sql("SET TRANSACTION READ ONLY")
            return _rows(connection, sql)  # the context manager rolls the transaction back
    except SQLAlchemyError as exc:
        if "read-only transaction" in str(exc):
            reason = str(exc.orig).strip()
            raise ConfigError(f"query refused: {reason}; {_READ_ONLY_HINT}") from None
        raise ConfigError(
            f"query failed: {getattr(exc, 'orig', None) or exc} (one SQL statement per query; "
            "tables and views: see docs/database.md)"
        ) from None


_READ_ONLY_HINT = "'aisafety query' is read-only (SELECT, WITH, read-only PRAGMAs)"
# A READ ONLY transaction still lets COPY ... TO write a file on the server.
_PG_READING = re.compile(
    r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*(select|with|values|table|show|explain)\b",
    re.IGNORECASE | re.DOTALL,
)


def _check_postgresql_statement(sql: str) -> None:
    if not _PG_READING.match(sql):
        first = sql.strip().split(None, 1)[0] if sql.strip() else "(empty)"
        raise ConfigError(f"query refused: {first} is not a reading statement; {_READ_ONLY_HINT}")


def _sqlite_query(connection: Connection, sql: str) -> tuple[list[str], list[tuple]]:
    raw = connection.connection.dbapi_connection
    authorizer = _Authorizer()
    raw.set_authorizer(authorizer)
    try:
        return _rows(connection, sql)
    except SQLAlchemyError:
        if authorizer.refused is not None:
            raise ConfigError(
                f"query refused: {authorizer.refused} would change the database or write a "
                f"file; {_READ_ONLY_HINT}"
            ) from None
        raise
    finally:
        raw.set_authorizer(None)  # the connection goes back to a pool a writer may use


def _rows(connection: Connection, sql: str) -> tuple[list[str], list[tuple]]:
    result = connection.exec_driver_sql(sql)
    if not result.returns_rows:
        return [], []
    return list(result.keys()), [tuple(r) for r in result]
