"""The results store, dataset loaders and model zoo.

Nothing heavy is imported here: the command line reads ``DEFAULT_URL`` without loading
SQLAlchemy or torch.
"""

DEFAULT_URL = "sqlite:///aisafety.db"  # the results database when no --db is given
