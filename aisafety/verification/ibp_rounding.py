"""Outward margins for IBP's boxes, which are computed in the graph's dtype.

An interval rule computed in floating point rounds to nearest, so its box can be a few ulps
narrower than the exact range of the op over the input box (resnet_4b's first convolution:
6,311 of 8,192 lower ends above the exact minimum, by up to 1.8e-15; docs/certification.md).
A sum of ``n`` rounded terms differs from the exact one by at most ``gamma(n) = n u / (1 - n
u)`` times the sum of their absolute values (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., eq. 3.5: any summation order). Each rule below bounds the sums it
computes by a ``magnitude`` (that sum of absolute values, itself computed) and widens its
box by ``2 gamma(n + 5) magnitude``: the factor 2 and the extra terms cover the rounding of
the centre, the radius, the end's own subtraction and of the margin itself. Only float64
boxes are widened: every verifier bounds a float64 graph (``certified.py``, ``vnncomp.py``);
a float32 graph is a training one (``margins.py``: an objective, not a certificate, whose
values stay as they were), and its backward passes carry no margin either.
"""

from __future__ import annotations

import torch

U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53
# how far (in ulps) a float64 sigmoid or tanh may be from the exact value: no library
# guarantees a bound (CUDA's tables are "not guaranteed"); measured here at most 1.99
# (sigmoid) and 0.75 (tanh) on torch's CPU kernels (docs/certification.md), so 128x that
FUNCTION_ULPS = 256


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n: the relative error bound of a sum of ``n`` rounded products."""
    if n * u >= 1:
        return float("inf")
    return n * u / (1 - n * u)


def rounded(box_end: torch.Tensor) -> bool:
    """Whether a box in this dtype gets the margin: float64, the verifiers' graphs."""
    return box_end.dtype == torch.float64


def widen(
    lo: torch.Tensor, hi: torch.Tensor, magnitude: torch.Tensor, terms: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[lo, hi]`` widened by the rounding of sums of ``terms`` terms whose absolute values
    sum to ``magnitude``; float64 boxes only (``rounded``)."""
    if not rounded(lo):
        return lo, hi
    # underflow adds at most the smallest normal number per rounded operation
    margin = 2 * gamma(terms + 5, U64) * magnitude + (terms + 5) * torch.finfo(lo.dtype).tiny
    return lo - margin, hi + margin


def widen_evaluated(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[f(l), f(u)]`` of a monotone ``f`` evaluated in float64 (sigmoid, tanh), widened
    by ``FUNCTION_ULPS`` ulps of each end (an ulp is at most ``2^-52 |y|``) and the
    smallest normal number (below it an ulp is absolute: ``sigmoid(-710)`` is 0, the exact
    value 4e-309); float64 boxes only (``rounded``)."""
    if not rounded(lo):
        return lo, hi
    tiny = torch.finfo(lo.dtype).tiny
    margin = lambda y: FUNCTION_ULPS * 2.0**-52 * y.abs() + tiny  # noqa: E731
    return lo - margin(lo), hi + margin(hi)
