"""Float64 rounding margins of the Lipschitz verifiers (Op-Norm, FastLip, RecurJac).

Their bound ``g(c) - sum_i G_i r_i`` is computed in float64, rounded to nearest: the centre
and half-widths of the box, the forward pass at the centre, the gradient bound ``G`` and
the final sum each round, and without a margin the bound sat above the exact one on about
half of the seeds of a 12-input net (docs/certification.md). Each bound here follows
``float64_margin``'s rule: ``factor(n)`` times the sum of the absolute terms of the sums.

* The box: ``c = (u + l) / 2`` and ``r = (u - l) / 2`` each round by at most ``u`` of
  their size, so ``|x - c| <= r + factor(2) (|c| + r)`` on the box.
* The forward pass at ``c``: an affine op's rounding is at most ``factor(n) |W| m`` (``m``
  the magnitude of its input) and an earlier error ``e`` moves its output by at most
  ``|W| e``; ReLU is exact and 1-Lipschitz; sigmoid and tanh (slopes <= 1, values <= 1) add
  their evaluation's error, ``ibp_rounding.FUNCTION_ULPS`` ulps of 1.
* ``G``: FastLip's interval arithmetic moves each end of an interval by at most ``|W|^T``
  times the ends' earlier errors (the interval image is monotone in the ends) plus its own
  rounding, at most ``gamma(n + 4)`` of ``|mid| + rad`` <= ``J``, the row's absolute
  Jacobian ``|C| |W_L| ... |W_1|`` (ReLU slopes 1): at most ``L gamma(n + 4) J`` in all
  for ``L`` ops. RecurJac's recursion has the same rounding per level, but its bounds of
  ``H`` also decide signs: a sign taken from a bound off by ``eps`` costs at most ``|v| eps``
  more, which can double the error per level, so ``2^levels L gamma(n + 4) J`` (argued,
  not proved term by term; checked against ``Fraction`` on exact-relaxation nets).
  Op-Norm's constant is a product of non-negative factors but for ``||C W_L||_1``, whose
  products cancel: ``factor`` of ``||C| |W_L||_1`` times the norms.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from aisafety.verification import float64_margin as fm
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ibp_rounding import FUNCTION_ULPS
from aisafety.verification.ops import Op
from aisafety.verification.relaxations import RELU

BOX_AFFINE = {"dense", "conv", "elementwise", "positive-linear"}


def widest(graph: BoundGraph) -> int:
    """The most terms of any sum of a pass over ``graph``: a node's size, and a constant."""
    return fm.terms(graph.ops) + 2


def covering_radius(centre: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Half-widths that, from the computed ``centre``, cover the box it came from."""
    return radius + fm.slack(2, centre.abs() + radius)


def forward_error(graph: BoundGraph, centre: torch.Tensor) -> torch.Tensor:
    """A bound (B, outputs) on how far ``graph.forward(centre)`` is from its exact value."""
    magnitude, error = centre.abs(), torch.zeros_like(centre)
    n = widest(graph)
    for op in graph.ops[1:]:
        if op.kind in BOX_AFFINE and not getattr(op, "permutation", False):
            size, moved = fm.through(op, magnitude), fm.through(op, error, constant=False)
            error = moved + fm.slack(n, size + moved)
            magnitude = size + error
        elif op.kind == "activation" and op.relaxation is RELU:
            continue  # exact, 1-Lipschitz
        elif op.kind == "activation":  # sigmoid, tanh: slope <= 1, values in [-1, 1]
            error = error + FUNCTION_ULPS * 2.0**-52 + fm.TINY
            magnitude = torch.ones_like(magnitude)
        else:  # reshape, permutation: copies
            magnitude, error = op.forward(magnitude), op.forward(error)
    return error.flatten(1) + fm.slack(n, magnitude.flatten(1))


def rows_error(spec: torch.Tensor, outputs: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    """A bound (B, K) on how far the computed rows ``C f`` are from ``C f_exact``."""
    size = spec.abs() @ (outputs.abs() + error).unsqueeze(2)
    return (spec.abs() @ error.unsqueeze(2)).squeeze(2) + fm.slack(
        spec.shape[2] + 2, size.squeeze(2)
    )


def absolute_jacobian(graph: BoundGraph, spec: torch.Tensor) -> torch.Tensor:
    """``|C| |W_L| ... |W_1|`` (B, K, *input), every activation's slope taken as 1: above
    every magnitude the gradient bounds compute."""
    out = graph.ops[-1]
    a = spec.abs().reshape(*spec.shape[:2], *out.out_shape)
    for op in graph.ops[-1:0:-1]:
        if op.kind != "activation":
            (a,), _ = absolute(op).backward(a, None)
    return a


def gradient_error(graph: BoundGraph, spec: torch.Tensor, doublings: int = 0) -> torch.Tensor:
    """The bound on a gradient bound's rounding, (B, K, *input) (module docstring)."""
    jacobian = absolute_jacobian(graph, spec)
    return fm.slack(2**doublings * len(graph.ops) * (widest(graph) + 4), jacobian)


def lower(value: torch.Tensor, gradient: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """``value - sum_i G_i r_i`` (B, K), less the rounding of its products and sum."""
    spent = (gradient * radius.unsqueeze(1)).flatten(2).sum(2)
    n = radius[0].numel() + 2
    return value - spent - fm.slack(n, spent + value.abs())


def absolute(op: Op) -> Op:
    """``op`` with |weights| and no bias: its backward maps r to |W|^T r."""
    changes = {}
    for key in ("weight", "scale"):
        if getattr(op, key, None) is not None:
            changes[key] = getattr(op, key).abs()
    for key in ("bias", "shift"):
        if getattr(op, key, None) is not None:
            changes[key] = torch.zeros_like(getattr(op, key))
    return replace(op, **changes) if changes else op
