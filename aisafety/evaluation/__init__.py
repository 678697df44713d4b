"""Evaluation module: metrics computed from shared, cached artifacts."""
