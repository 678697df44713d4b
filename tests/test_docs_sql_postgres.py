"""Every SQL block of README.md and docs/*.md runs on PostgreSQL too, not only on SQLite.

``tests/test_docs.py`` runs the blocks on the sandbox's SQLite database, whose loose typing
accepts what PostgreSQL refuses (``MIN(success) = 1`` on a BOOLEAN column: README's query
failed there until session 21). PostgreSQL checks types when it plans a statement, so an
empty database with this release's tables is enough to catch such a query: no evaluation.
"""

from __future__ import annotations

import re

from docs_blocks import all_blocks


def _statements(body: str) -> list[str]:
    return [s for s in body.split(";") if re.sub(r"--[^\n]*", "", s).strip()]


def test_every_docs_sql_statement_plans_on_postgresql(postgres_url) -> None:
    from aisafety.store.read_only import query_read_only, read_only_engine
    from aisafety.store.results import ResultStore

    ResultStore(postgres_url)  # this release's tables and views, no rows
    engine = read_only_engine(postgres_url)
    ran = 0
    for block in all_blocks():
        if block.lang != "sql" or "skip" in block.directives:
            continue
        for statement in _statements(block.body):
            try:
                query_read_only(engine, statement)
            except Exception as error:  # noqa: BLE001 - name the block that failed
                raise AssertionError(f"{block.id} fails on PostgreSQL: {error}") from error
            ran += 1
    engine.dispose()
    assert ran >= 5, f"only {ran} SQL statements found in the docs"
