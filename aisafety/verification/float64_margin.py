"""Rounding margins for CROWN's float64 backward passes (``bounds.backward`` unrounded).

A float64 pass rounds to nearest like a float32 one, only 2^29 times less: its bound can
sit a few ulps above the exact bound of its relaxation (a linear net's margin, whose
relaxation is exact, by up to 6e-12 on a tiny test net; docs/certification.md). The same
argument as ``rounding.py``'s, without its exact constants: when an op maps the computed
coefficients ``A`` of its output to computed ``A'`` and constant ``s``, the exact ``A out``
and ``A' in + s`` differ by at most ``gamma(n) <|A|, v>`` (Higham eq. 3.5, any order), with
``v`` per sample the sum of the absolute terms of the op's output over its input box
(``weight``) and ``n`` the row's own count of nonzero coefficients (a product with a zero
adds an exact zero). ``factor`` is ``2 gamma(2 n + 8) >= 4 gamma(n)``: the extra covers the
rounding of ``v`` itself, of the margins' own dots and sums and of the final subtractions
(each a relative ``gamma`` far below 1). Where the pass ends, the concretisation's products
and sum, and the float64 sums of the constants, are bounded the same way (``bounds.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aisafety.verification import budget, memo
from aisafety.verification.ibp_rounding import U64, gamma
from aisafety.verification.ops import Box, Op
from aisafety.verification.property import rounded_down
from aisafety.verification.relaxations import RELU, SShapeRelaxation

EXACT = {"input", "reshape", "add", "window"}  # copies: no rounding
# covers underflow: at most the smallest normal number per rounded operation
TINY = 1e-290


def applies(a: torch.Tensor) -> bool:
    """Float64 passes get the margin; a float32 (training) pass is an objective, not a
    certificate, and keeps none (as IBP's float32 boxes, ``ibp_rounding.py``)."""
    return a.dtype == torch.float64


def factor(n: torch.Tensor | int) -> torch.Tensor | float:
    """The margin per unit of ``<|A|, v>`` for sums of ``n`` terms: ``gamma(n)`` for the
    pass, twice over for the rounding of the margin's own dot products and sums."""
    if isinstance(n, int):
        return 2 * gamma(2 * n + 8, U64)
    nu = (2 * n.double() + 8) * U64
    return torch.where(nu < 1, 2 * nu / (1 - nu), torch.inf)


def slack(n: int, size: torch.Tensor) -> torch.Tensor:
    """The rounding bound of float64 sums of at most ``n`` terms whose absolute values sum to
    ``size`` (``factor``, and underflow: ``TINY`` per operation), for a forward computation
    (DeepZ's zonotopes, the Lipschitz verifiers); 0 for float32 (``applies``)."""
    if not applies(size):
        return torch.zeros_like(size)
    return factor(n) * size + TINY * (n + 4)


def terms(ops: list[Op]) -> int:
    """The most terms of any sum a pass through ``ops`` (from the input on) computes: at
    most the size of a node (an op's output, or another op's input)."""
    return max(budget.numel(op.out_shape) for op in ops) + 2


def magnitude(box: Box) -> torch.Tensor:
    """max |z| over the box."""
    return torch.maximum(box[0].abs(), box[1].abs())


def weight(op: Op, boxes: list[Box]) -> torch.Tensor | None:
    """``v`` (B, *out_shape) of ``op`` over its input ``boxes``, kept on the box while it is
    unchanged; None for an op that only copies."""
    if op.kind in EXACT or (op.kind == "positive-linear" and op.permutation):
        return None
    box = boxes[0]
    tensors = tuple(v for v in vars(op).values() if isinstance(v, torch.Tensor))
    deps = (box[1], op, *tensors)  # a weight changed in place computes ``v`` afresh
    return memo.on_tensor(box[0], f"_f64_weight{id(op)}", deps, lambda: _weight(op, box))


def through(op: Op, m: torch.Tensor, constant: bool = True) -> torch.Tensor:
    """The sum of the absolute terms of an affine ``op``'s output where its input's
    magnitude is ``m`` >= 0: ``|W| m + |b|`` (the constant left out without ``constant``);
    a copy (reshape, permutation) moves ``m``."""
    if op.kind == "dense":
        bias = op.bias.abs() if constant and op.bias is not None else None
        return F.linear(m, op.weight.abs(), bias)
    if op.kind == "conv":
        return op.conv(
            m, op.weight.abs(), op.bias.abs() if constant and op.bias is not None else None
        )
    if op.kind == "elementwise":
        return op.scale.abs() * m + op.shift.abs() if constant else op.scale.abs() * m
    if op.kind in ("positive-linear", "reshape"):  # non-negative coefficients, no constant
        return op.forward(m)
    raise ValueError(f"{op.kind} node {op.name!r} is not affine")


def _weight(op: Op, box: Box) -> torch.Tensor:
    m = magnitude(box)
    if op.kind in ("dense", "conv", "elementwise", "positive-linear"):
        return through(op, m)
    if op.kind == "maxpool":
        # the coefficients summed where windows overlap, each times its chosen input
        # (<= the window's largest magnitude), and the constant, the window's largest upper
        return 2 * op.fn(m)
    if op.kind == "activation":
        # ReLU: slopes in [0, 1], intercept |ub| <= |l| (the chord) or 0
        if op.relaxation is RELU:
            return 2 * m
        # sigmoid and tanh: |k| <= 1 (f' <= 1, up to 1e-12 of rounding), b = f(p) - k p at a
        # p of the box widened by the lines' safety s: |b| <= (1 + |k| m)(1 + s) + s, so
        # |k| m + |b| <= (2 m + 1)(1 + 2 s); 2 m + 1 alone falls short on wide boxes
        # (tests/test_sshape_exact_lines.py: 2e8 + 9 on [-1e8, 1e8])
        if isinstance(op.relaxation, SShapeRelaxation):
            return (2 * m + 1) * (1 + 4 * op.relaxation.safety)
    raise ValueError(f"no float64 rounding bound for {op.kind} node {op.name!r}")


def dot(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``factor(n) <|A|, v>`` per row (B, K), ``n`` the row's own nonzero coefficients: a
    product with a zero coefficient adds an exact zero, so every sum of an op's rule has at
    most that many rounded terms, and a receptive-field crop (the same nonzeros, fewer
    zeros) gets the dense pass's margin.

    One ``|A|`` and two batched products (with ``v``, then with ones once ``|A|`` is its
    own sign): 3.4x faster than the product's and the count's own temporaries (8 x 512
    rows of 784, one thread), which took 31% of ``wk``'s CPU (docs/certification.md)."""
    rows = a.flatten(2).abs()
    b = rows.shape[0]
    column = v.flatten(1).expand(b, -1).unsqueeze(2).to(rows.dtype)
    total = torch.bmm(rows, column).squeeze(2)
    # autograd keeps ``rows`` where the product has a gradient: through ``v`` too (a float64
    # slope search, whose boxes come from the slopes)
    signs = rows.sign() if total.requires_grad else rows.sign_()
    n = torch.bmm(signs, rows.new_ones(b, rows.shape[2], 1)).squeeze(2)
    return factor(n) * total


def concretise_margin(coeff: torch.Tensor, box: Box) -> torch.Tensor:
    """The bound on the rounding of ``concretize``'s products and sum (B, K)."""
    return dot(coeff, magnitude(box))


def op_slack(op: Op, coeff: torch.Tensor, boxes: list[Box]) -> torch.Tensor | float:
    """The rounding bound (B, K) of ``op``'s backward rule applied to ``coeff`` in a float64
    pass (0 for a copy)."""
    v = weight(op, boxes)
    return 0.0 if v is None else dot(coeff, v.to(coeff.dtype))


def sum_slack(total: torch.Tensor, box: Box) -> torch.Tensor:
    """The rounding bound (B, K) of one float64 addition into the coefficients ``total`` of
    a node whose box is ``box`` (a node read twice, or a split's ``- beta s``): the sum
    rounds by at most ``u |total|`` per element, so its effect is below ``<|total|, m>``."""
    return dot(total, magnitude(box))


def lower(
    value: torch.Tensor,
    coeff: torch.Tensor,
    box: Box,
    size: torch.Tensor,
    slack: torch.Tensor,
    sums: int,
    ops: list[Op],
) -> torch.Tensor:
    """A pass's bound (B, K) once its rounding is subtracted: ``value`` (the concretisation
    of ``coeff`` on the input ``box`` plus the constants, whose absolute values sum to
    ``size``) minus the ops' ``slack``, the concretisation's, and the float64 sums of the
    constants and the margins (``sums`` terms at most: ``factor`` covers them and the final
    subtractions), and underflow, at most ``TINY`` per rounded operation."""
    slack = slack + concretise_margin(coeff, box)
    total = factor(sums) * (size + value.abs() + slack)
    return value - slack - total - TINY * terms(ops)


def added_down(bound: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``bound + offset`` rounded toward -inf (a property's offset ``d`` added to a proved
    bound): the nearest sum can be half an ulp above the exact one. The rounding error of
    the sum is exact (Knuth's TwoSum), so the sum moves one ulp down only where it rose.
    A wider offset is first narrowed down (``rounded_down``), not to nearest."""
    offset = rounded_down(offset, bound.dtype)
    total = bound + offset
    back = total - bound
    error = (bound - (total - back)) + (offset - back)  # exact: bound + offset - total
    down = torch.nextafter(total, total.new_tensor(-torch.inf))
    return torch.where(torch.isfinite(total) & (error < 0), down, total)
