"""Bringing a results database to this code's schema when the store opens it (Alembic).

* A new database: the tables of ``schema.py`` are created and stamped with the head revision.
* A database at an older revision, or made before Alembic (no ``alembic_version`` table):
  the revisions in ``migrations/versions/`` bring it to the head, in one transaction, so a
  failed upgrade leaves it as it was.
* A database at the head: one SELECT, without importing Alembic.
* A database at a revision this code does not know (written by a newer aisafety): refused,
  naming the revision and the fix, before anything is written.

Many processes may open one database at once (the workers of a Ray cluster): the upgrade runs
under a lock (PostgreSQL: an advisory lock; SQLite: ``BEGIN IMMEDIATE``, its write lock) and
whoever gets the lock second finds the work done. Read-only opens (``aisafety query``,
``read_only.py``) never come here, so they never change a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import MetaData, inspect, text
from sqlalchemy.engine import Connection, Engine

from aisafety.errors import StoreError
from aisafety.store.engine import with_retries
from aisafety.store.migrations import HEAD

MIGRATIONS = Path(__file__).with_name("migrations")
VERSION_TABLE = "alembic_version"
LOCK_KEY = 0x41495361  # PostgreSQL advisory lock held while a database is being upgraded


def migrate(
    engine: Engine,
    metadata: MetaData,
    views: Iterable[str],
    scripts: Path = MIGRATIONS,
    head: str = HEAD,
) -> None:
    """Create, upgrade or accept the database behind ``engine``; refuse a newer one.
    ``scripts`` and ``head`` are those of the shipped migrations (tests pass others)."""
    with engine.connect() as connection:
        if stamped(connection) == (head,):
            return
    with_retries(
        f"bring the tables of {engine.url} to schema revision {head}",
        lambda: _migrate(engine, metadata, tuple(views), scripts),
    )


def stamped(connection: Connection) -> tuple[str, ...]:
    """The revisions the database is stamped with; () before Alembic or when empty."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return ()
    rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
    return tuple(sorted(rows.scalars()))


def _migrate(engine: Engine, metadata: MetaData, views: tuple[str, ...], scripts: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(scripts))
    with _exclusive(engine) as connection:
        current = stamped(connection)  # again, under the lock: another process may have won
        _refuse_unknown(engine, script, current)
        if current == tuple(script.get_heads()):
            return
        if not current and not inspect(connection).has_table("runs"):  # a new database
            metadata.create_all(connection)
            for view in views:
                connection.execute(text(_portable_view(connection, view)))
            MigrationContext.configure(connection).stamp(script, "heads")
            return
        config = Config()
        config.set_main_option("script_location", str(scripts))
        config.attributes["connection"] = connection  # env.py migrates this connection
        command.upgrade(config, "heads")


def _refuse_unknown(engine: Engine, script, current: tuple[str, ...]) -> None:
    from alembic.util import CommandError

    for revision in current:
        try:
            script.get_revision(revision)
        except CommandError:
            from aisafety.version import __version__

            raise StoreError(
                f"the results database {engine.url.render_as_string(hide_password=True)} has "
                f"schema revision {revision!r}, which aisafety {__version__} does not know "
                f"(its newest is {script.get_current_head()!r}): a newer aisafety wrote it. "
                "Upgrade aisafety (pip install -U aisafety) to use this database, or give "
                "another --db"
            ) from None


@contextmanager
def _exclusive(engine: Engine) -> Iterator[Connection]:
    """A transaction that no other process's upgrade of this database runs beside."""
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # the driver would begin only at the first INSERT; the DDL must be inside too
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        elif connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
        yield connection
        connection.commit()


def _portable_view(connection: Connection, view: str) -> str:
    if connection.dialect.name == "postgresql":  # no IF NOT EXISTS for views
        return view.replace("CREATE VIEW IF NOT EXISTS", "CREATE OR REPLACE VIEW")
    return view
