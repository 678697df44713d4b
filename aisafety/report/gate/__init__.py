"""The release gate (``aisafety check``): requirements, paired statistics against a baseline
run, verdicts and their CI outputs (docs/release-gate.md)."""
