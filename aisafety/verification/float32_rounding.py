"""Certificates of the float32 network: the verifier setting ``float32: rigorous`` (#33).

By default a certificate is of the network in exact real arithmetic (docs/own-model.md).
The float32 network the user runs differs from it by its rounding, and where a margin is
within that rounding the two can disagree (docs/certification.md, "Float32 ties"). Inside
``rigorous()`` the verifiers bound the float32 network instead. Its op ``i`` outputs the
exact op applied to its float32 input plus an error ``r_i``, ``|r_i| <= e_i`` (``error``),
so ``r_i`` is one more bounded input: IBP widens each box by ``e_i`` (``widened``), and a
backward pass that reaches op ``i`` with coefficients ``A`` on its output subtracts
``<|A|, e_i>`` (``slack``), the exact lower bound of ``A r_i``. Every box then holds the
float32 values, so the relaxations built on it hold for the float32 network, and so does
every bound computed from them. ``e_i`` uses Higham's ``gamma_n`` with the float32 unit
roundoff over the op's sum of absolute terms, on the (float32-sound) box of its input.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar

import torch

from aisafety.scoped import scoped
from aisafety.verification import memo
from aisafety.verification.float64_margin import magnitude, through
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.ibp_rounding import FUNCTION_ULPS, U32, gamma
from aisafety.verification.ops import Box, Op
from aisafety.verification.relaxations import RELU

SETTING = "float32"  # the verifier setting's name, for messages
# ops whose float32 evaluation is exact: copies, a ReLU, a max (of float32 values)
EXACT = {"input", "reshape", "window", "maxpool"}
# the float64 sums and products that compute e and <|A|, e> round down by at most
# gamma_n(2^-53) < 2^-20 for n < 2^30 terms: every bound here is scaled up by this
SAFETY = 1 + 2.0**-20
_ON: ContextVar[bool] = ContextVar("float32_rigorous", default=False)


def rigorous(on: bool = True) -> AbstractContextManager[bool]:
    """Bounds inside this block hold for the float32 network (``on``) or for the exact one."""
    return scoped(_ON, on)


def active() -> bool:
    return _ON.get()


def require(graph: BoundGraph, verifier: str) -> None:
    """Refuse, before any bound, a graph with an op whose float32 rounding has no bound."""
    for op in graph.ops:
        why = _unbounded(op)
        if why:
            raise VerificationError(
                f"verifier {verifier!r} with {SETTING}: rigorous cannot bound the float32 "
                f"rounding of {op.kind} node {op.name!r} of model {graph.model!r} ({why}); "
                f"use {SETTING}: exact (the default: certificates of the exact network)"
            )


def _unbounded(op: Op) -> str:
    return ""


def error(op: Op, boxes: list[Box]) -> torch.Tensor | None:
    """``e`` (B, *out_shape, float64): the most the float32 evaluation of ``op`` on inputs
    in ``boxes`` can differ from the exact op on the same inputs; None where it is exact.
    Kept on the first input box while it is unchanged (``memo.py``)."""
    if op.kind in EXACT or (op.kind == "activation" and op.relaxation is RELU):
        return None
    if op.kind == "positive-linear" and op.permutation:
        return None
    tensors = tuple(v for v in vars(op).values() if isinstance(v, torch.Tensor))
    deps = (*(t for box in boxes for t in box), op, *tensors)
    return memo.on_tensor(boxes[0][0], f"_f32_error{id(op)}", deps, lambda: _error(op, boxes))


def _error(op: Op, boxes: list[Box]) -> torch.Tensor:
    m = [magnitude(box).double() for box in boxes]
    if op.kind == "dense":  # a sum of n products and the bias: gamma(n + 1) (Higham 3.5)
        return gamma(op.weight.shape[1] + 1) * _wide_through(op, m[0]) * SAFETY
    if op.kind == "conv":  # direct convolution (no Winograd/FFT): n = C_in / groups * kh * kw
        return gamma(op.weight[0].numel() + 1) * _wide_through(op, m[0]) * SAFETY
    if op.kind == "elementwise":
        # x + c, x * c, x / c: one rounding of |y|; Normalize's (x - mean) / std two; the
        # third covers the float64 reading of scale and shift (graph._elementwise). A
        # BatchNorm rounds its folded constants too: ``terms`` sums their absolute values
        terms = op.shift.abs() if op.terms is None else op.terms
        size = op.scale.abs() * m[0].to(op.scale.dtype) + terms.to(op.scale.dtype)
        return gamma(op.roundings) * size.double() * SAFETY
    if op.kind == "activation":  # sigmoid, tanh: FUNCTION_ULPS float32 ulps of the value
        lo, hi = op.interval(*boxes)
        size = torch.maximum(lo.abs(), hi.abs()).double()
        return (FUNCTION_ULPS * 2.0**-23 * size + FUNCTION_ULPS * 2.0**-149) * SAFETY
    if op.kind == "add":  # one rounding of the sum
        return U32 * (m[0] + m[1]) * SAFETY
    if op.kind == "positive-linear":  # average / sum: at most the input's size terms, a divide
        terms = boxes[0][0][0].numel() + 2
        return gamma(terms) * op.forward(m[0].to(_dtype(op))).double() * SAFETY
    raise VerificationError(f"no float32 rounding bound for {op.kind} node {op.name!r}")


def _dtype(op: Op) -> torch.dtype:
    tensors = [v for v in vars(op).values() if isinstance(v, torch.Tensor)]
    return tensors[0].dtype if tensors else torch.float64


def _wide_through(op: Op, m: torch.Tensor) -> torch.Tensor:
    """``|W| m + |b|`` in the op's dtype (float64 on a float64 graph; a float32 pass's op is
    the float64 graph's, ``bounds.backward``)."""
    return through(op, m.to(_dtype(op))).double()


def widened(box: Box, e: torch.Tensor | None) -> Box:
    """``box`` widened by ``e`` on both sides, one ulp further out for the float64 sums."""
    if e is None:
        return box
    lo, hi = box
    down = torch.nextafter(lo - e.to(lo.dtype), lo.new_tensor(-torch.inf))
    return down, torch.nextafter(hi + e.to(hi.dtype), hi.new_tensor(torch.inf))


def interval(op: Op, boxes: list[Box]) -> Box:
    """IBP's box of ``op`` on ``boxes``, widened by its float32 rounding when ``active``."""
    box = op.interval(*boxes)
    return widened(box, error(op, boxes)) if active() else box


def slack(op: Op, coeff: torch.Tensor, boxes: list[Box]) -> torch.Tensor | float:
    """``<|A|, e>`` per row (B, K), rounded up: the least ``A r`` can be for the op's
    float32 error ``r``, with ``A`` (B, K, *out_shape) the coefficients on its output."""
    e = error(op, boxes)
    if e is None:
        return 0.0
    rows = coeff.flatten(2).abs().to(torch.float64)
    column = e.flatten(1).expand(rows.shape[0], -1).unsqueeze(2)
    return torch.bmm(rows, column).squeeze(2) * SAFETY


def lowered(bound: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``bound - e`` rounded down (one ulp below the nearest difference)."""
    return torch.nextafter(bound - e.to(bound.dtype), bound.new_tensor(-torch.inf))
