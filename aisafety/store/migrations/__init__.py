"""Alembic migrations of the results database (docs/database.md, "Schema versions").

``HEAD`` is the newest revision in ``versions/``: a database stamped with it needs nothing,
so opening one reads a single row and never imports Alembic (tests/test_migrations.py
checks that it is the script directory's head). A change to ``schema.py`` comes with a new
revision file in ``versions/`` and a new ``HEAD``; tests/test_migrations.py fails until the
revisions build exactly the tables of ``schema.py``.
"""

HEAD = "0006_reused_units"
