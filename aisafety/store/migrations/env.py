"""Alembic's environment: migrate the connection the store hands over (in its transaction
and under its lock, aisafety/store/migration.py), or, from the ``alembic`` command line,
the database of ``-x db=URL``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from aisafety.store import schema


def run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=schema.Base.metadata,
        # SQLite alters a column only by copying its table: autogenerate writes batch blocks
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():  # a no-op inside the store's own transaction
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
shared = context.config.attributes.get("connection")
if shared is not None:
    run(shared)
else:
    url = context.get_x_argument(as_dictionary=True).get("db")
    if url is None:
        raise SystemExit("give the database: alembic -c ... -x db=URL upgrade head")
    with create_engine(url).begin() as connection:
        run(connection)
