"""A float32 pass through an elementwise op whose float64 scale float32 does not hold
(a normalisation's 1 / std, read in float64 since session 16): ``rounding.exact_shift``'s
margin covers the scale's own rounding as well as the product's, checked in exact
rational arithmetic on the case that makes both roundings err the same way."""

from __future__ import annotations

from fractions import Fraction

import torch

from aisafety.verification import ops, rounding


def test_the_margin_covers_a_rounded_scale_and_the_rounded_product():
    n = 64
    # s64 = 1.5 - 2^-24 + 2^-40 rounds to s32 = 1.5; a = 1 + 2^-23: fl(a s32) = 1.5 + 2^-22
    # (a tie, to even), exact a s64 = 1.5 + 2^-23 + ...: each element off by about
    # 2^-23 = 1.33 u |a s64|, more than gamma(1) |a s64| alone covers
    s64 = torch.full((n,), 1.5 - 2.0**-24 + 2.0**-40, dtype=torch.float64)
    wide = ops.Elementwise("norm", [0], (n,), scale=s64, shift=torch.zeros(n, dtype=torch.float64))
    a = torch.full((1, 1, n), 1 + 2.0**-23, dtype=torch.float32)
    back = [a * s64.float()]
    lo, hi = -torch.ones(1, n), torch.ones(1, n)
    shift, err = rounding.exact_shift(wide, a, back, [(lo, hi)])
    claimed = Fraction(float(shift[0, 0])) - Fraction(float(err))
    # min over the box of a.op(h) - back.h = sum_i -|a_i s_i - back_i| (h in [-1, 1], no shift)
    exact = -sum(abs(Fraction(float(a[0, 0, i])) * Fraction(float(s64[i]))
                     - Fraction(float(back[0][0, 0, i]))) for i in range(n))  # fmt: skip
    assert exact < 0  # the roundings do not cancel here
    assert claimed <= exact
