"""Robustness verification: certificates that no perturbation in a ball changes the answer."""
