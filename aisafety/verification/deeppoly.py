"""DeepPoly (Singh et al. 2019): back-substitution with one lower and one upper line per neuron.

Its ReLU transformer on an unstable neuron (l < 0 < u) keeps the upper chord
u (z - l) / (u - l) and picks the lower line lambda z with lambda in {0, 1} of the smaller
area: lambda = 1 if u > -l, else 0 (a tie, u = -l, takes 0, as the paper's running
example does for x5 >= 0 on [-2, 2]). Every neuron's bounds come from back-substituting
its lines to the input. That is CROWN's pass with CROWN's adaptive slope, which is the same
rule (Zhang et al. 2018 name the same choice); ``deeppoly_lower_slope`` states the rule on
its own, and ``tests/test_deeppoly.py`` checks it against CROWN's and the paper's example.
"""

from __future__ import annotations

import torch

from aisafety.verification.incomplete import CrownVerifier


def deeppoly_lower_slope(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """lambda of the ReLU lower line lambda z on [l, u]: the triangle of smaller area."""
    area_if_zero = upper * (upper - lower) / 2  # the triangle under lambda = 0
    area_if_one = -lower * (upper - lower) / 2  # the triangle under lambda = 1
    return (area_if_one < area_if_zero).to(lower.dtype)


class DeepPolyVerifier(CrownVerifier):
    name = "deeppoly"
    description = (
        "DeepPoly (Singh et al. 2019): back-substitution with the ReLU lower line of smaller "
        "area (lambda = 1 if u > -l else 0); the same bounds as CROWN"
    )
    tighter_than = ("crown", "ibp")  # equal to CROWN (tests/test_deeppoly.py)
