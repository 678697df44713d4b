"""The results store: SQLAlchemy tables (``schema``), their Alembic revisions (``migration``,
``migrations/``), writing a run (``results``), which stored runs are alive (``liveness``),
read-only queries (``read_only``) and comparing two stores (``compare``).

Nothing heavy is imported here: the command line reads ``DEFAULT_URL`` without loading
SQLAlchemy or torch.
"""

DEFAULT_URL = "sqlite:///aisafety.db"  # the results database when no --db is given
QUERY_TIMEOUT_S = 60.0  # ``aisafety query`` stops a statement after this long (--timeout)
QUERY_MAX_ROWS = 10_000  # and prints at most this many rows (--max-rows)
