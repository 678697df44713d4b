"""Training defenses: each supplies the per-batch loss of the one zoo training loop."""
