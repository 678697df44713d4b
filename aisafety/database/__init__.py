"""The results store, dataset loaders and model zoo.

Nothing heavy is imported here: the command line reads ``DEFAULT_URL`` without loading
SQLAlchemy or torch.
"""

DEFAULT_URL = "sqlite:///aisafety.db"  # the results database when no --db is given
QUERY_TIMEOUT_S = 60.0  # ``aisafety query`` stops a statement after this long (--timeout)
QUERY_MAX_ROWS = 10_000  # and prints at most this many rows (--max-rows)
