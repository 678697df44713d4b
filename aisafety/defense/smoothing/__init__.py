"""Randomized-smoothing certification (Cohen et al. 2019 and its l1 / l-inf relatives)."""
