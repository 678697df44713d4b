"""Built-in metrics, one family per file."""
