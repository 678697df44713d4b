"""Outward margins for IBP's boxes, which are computed in the graph's dtype.

An interval rule computed in floating point rounds to nearest, so its box can be a few ulps
narrower than the exact range of the op over the input box (resnet_4b's first convolution:
6,311 of 8,192 lower ends above the exact minimum, by up to 1.8e-15; docs/certification.md).
A sum of ``n`` rounded terms differs from the exact one by at most ``gamma(n) = n u / (1 - n
u)`` times the sum of their absolute values (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., eq. 3.5: any summation order). Each rule below bounds the sums it
computes by a ``magnitude`` (that sum of absolute values, itself computed) and widens its
box by ``2 gamma(n + 5) magnitude``: the factor 2 and the extra terms cover the rounding of
the centre, the radius, the end's own subtraction and of the margin itself. A box that
carries gradients (IBP training, ``margins.py``) is an objective, not a certificate: it is
left as computed, so training is unchanged.
"""

from __future__ import annotations

import torch

U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n: the relative error bound of a sum of ``n`` rounded products."""
    if n * u >= 1:
        return float("inf")
    return n * u / (1 - n * u)


def widen(
    lo: torch.Tensor, hi: torch.Tensor, magnitude: torch.Tensor, terms: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[lo, hi]`` widened by the rounding of sums of ``terms`` terms whose absolute values
    sum to ``magnitude``; unchanged where the box carries gradients (training)."""
    if lo.requires_grad or hi.requires_grad or not lo.is_floating_point():
        return lo, hi
    info = torch.finfo(lo.dtype)
    # underflow adds at most the smallest normal number per rounded operation
    margin = 2 * gamma(terms + 5, info.eps / 2) * magnitude + (terms + 5) * info.tiny
    return lo - margin, hi + margin
