"""Bounds of the float64 errors in the SDP verifiers' constraint matrices (``quadratic.py``).

The exact network is the graph's ops in exact arithmetic on their float64 weights. Its
affine maps between activations (``dense.affine_segments``) are exact where a segment has
one weighted op (a unit vector through a linear map, a convolution or a per-element scale
picks single weights; ``forward`` of zeros gives the bias); a segment of several is a
product of matrices, within ``((1 + g)^k - 1) |A_k| ... |A_1|`` of the exact one (Higham,
Accuracy and Stability, 3.5). The forms of v after them carry the error of each product
with the previous forms, and a constraint ``(alpha . v)(beta . v)`` stored as
``sym(alpha beta^T)`` is within ``||e_alpha|| ||beta|| + (||alpha|| + ||e_alpha||) ||e_beta||
+ g_2 ||alpha|| ||beta||`` of the exact one in the spectral norm (``|sym(x y^T)|``'s norm is
at most ``||x|| ||y||``, and a symmetric matrix's norm at most its absolute values')."""

from __future__ import annotations

import numpy as np
import torch

from aisafety.verification.float64_margin import TINY, factor
from aisafety.verification.graph import BoundGraph

# ops whose one application to a unit vector (and to zeros) is exact
EXACT_ALONE = ("dense", "conv", "elementwise")


def segment_errors(graph: BoundGraph) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per affine segment of ``affine_segments``, entrywise bounds (n_out, n_in) and
    (n_out,) of its computed matrix's and constant's errors."""
    cuts = [i for i, op in enumerate(graph.ops) if op.kind == "activation"]
    ends = [graph.ops[i].inputs[0] for i in cuts] + [len(graph.ops) - 1]
    errors = []
    for start, end in zip([0, *cuts], ends, strict=True):
        ops = graph.ops[start + 1 : end + 1]
        n_in = int(np.prod(graph.ops[start].out_shape))
        n_out = int(np.prod(graph.ops[end].out_shape))
        weighted = [op for op in ops if not _moves_only(op)]
        if len(weighted) <= 1 and all(op.kind in EXACT_ALONE for op in weighted):
            errors.append((np.zeros((n_out, n_in)), np.zeros(n_out)))
        else:
            errors.append(_product_error(graph, ops))
    return errors


def _moves_only(op) -> bool:
    """A reshape or a permutation: every rule exact."""
    return op.kind == "reshape" or getattr(op, "permutation", False)


def _product_error(graph: BoundGraph, ops) -> tuple[np.ndarray, np.ndarray]:
    """``((1 + g)^k - 1)`` times ``|A_k| ... |A_1|`` and ``|A_k|(...|c_1|...) + |c_k|``,
    each op's own matrix within one rounding of the exact (an average's 1/k), the
    absolute products rounded up by ``(1 + g)^k``."""
    matrices, constants = [], []
    for op in ops:
        shape = graph.ops[op.inputs[0]].out_shape
        n_in, n_out = int(np.prod(shape)), int(np.prod(op.out_shape))
        eye = torch.eye(n_out, dtype=graph.dtype).reshape(1, n_out, *op.out_shape)
        (back,), _ = op.backward(eye, None)
        zeros = torch.zeros(1, *shape, dtype=graph.dtype)
        matrices.append(np.abs(back.reshape(n_out, n_in).double().numpy()))
        constants.append(np.abs(op.forward(zeros).flatten().double().numpy()))
    widest = max(max(m.shape) for m in matrices) + 2
    growth = (1 + factor(widest)) ** len(ops)
    product, constant = matrices[0], constants[0]
    for m, c in zip(matrices[1:], constants[1:], strict=True):
        product, constant = m @ product, m @ constant + c
    scale = (growth - 1) * growth
    return scale * product + TINY, scale * constant + TINY


def affine_error(
    m: np.ndarray, c: np.ndarray, forms: np.ndarray, slack: np.ndarray, e_m, e_c
) -> tuple[np.ndarray, np.ndarray]:
    """The forms ``z = m forms + c e0`` and an entrywise bound of their error, the
    previous forms within ``slack`` and ``m``, ``c`` within ``e_m``, ``e_c``."""
    z = m @ forms
    z[:, 0] += c
    size = np.abs(m) @ np.abs(forms)
    size[:, 0] += np.abs(c)
    terms = m.shape[1] + 1
    e_z = np.abs(m) @ slack + e_m @ (np.abs(forms) + slack) + factor(terms) * size
    e_z[:, 0] += e_c
    return z, e_z + TINY * terms


def constraint_error(
    alpha: np.ndarray, beta: np.ndarray, e_alpha: np.ndarray, e_beta: np.ndarray
) -> float:
    """A bound of ``||stored sym(alpha beta^T) - exact||_2`` for forms within ``e_alpha``
    and ``e_beta`` (the stored matrix's own products and sum: ``factor(2)``)."""
    a, b = float(np.linalg.norm(alpha)), float(np.linalg.norm(beta))
    ea, eb = float(np.linalg.norm(e_alpha)), float(np.linalg.norm(e_beta))
    n = len(alpha)
    bound = ea * b + (a + ea) * eb + factor(2) * a * b
    return bound * (1 + factor(n + 4)) + TINY * n * n
