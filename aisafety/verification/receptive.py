"""Intermediate bounds of a convolution's neurons on their receptive fields only.

A backward pass from one neuron of a convolution layer has nonzero coefficients only on
that neuron's receptive field, yet a dense pass carries them over every pixel of every
layer: on the zoo's Conv-Small (28x28 input, two 4x4 stride-2 convolutions) a neuron of
the second layer sees 10x10 of the 28x28 input pixels and 4x4 of the first layer's 14x14
positions. auto_LiRPA keeps such coefficients as "patches" (one kernel per output
position). Here the same saving comes from the dense machinery itself: for a chain of
convolutions, ReLUs and per-channel affine ops ending at node ``j``, every output position
of ``j`` is one *sample* of a cropped copy of the chain, whose input is the receptive field
and whose convolutions have no padding; ``bounds._tighten`` then bounds each position's
unstable channels on its crop, with the same rules, rounding margins and memory budget.

Padding is what needs care. A crop that reaches past the edge of a node covers positions
that do not exist there; the convolution reading that node pads them with zeros. The crop's
boxes hold exactly that: the input's padding is the box [0, 0], and a padded ReLU output
(the only other node a padded convolution may read here) is [0, 0] with its ReLU input box
at [-TINY, -TINY], a stably inactive ReLU whose relaxation (slopes 0, intercepts 0) zeroes
the coefficients there, so the garbage the cropped convolution computes at those positions
is multiplied by zero. The bound of each neuron is therefore the dense pass's, summed in a
different order (tests/test_receptive.py).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aisafety.verification import ops
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.relaxations import RELU

TINY = 1e-30  # a padded ReLU input: stably inactive, and float32 holds it
# crop only where a neuron's receptive field is at most this share of the input
SHARE = 0.5
LARGEST = 1 << 22  # elements of a cropped convolution's dense matrix
_ENABLED: ContextVar[bool] = ContextVar("receptive_crops", default=True)


@contextmanager
def dense_passes() -> Iterator[None]:
    """Bound every neuron with dense passes inside this block (tests, the bench)."""
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


@dataclass
class Crops:
    """The cropped chain from node ``first`` (its input) to node ``j`` (its output), and
    where each node's window starts (index ``i`` is node ``first + i``)."""

    graph: BoundGraph
    first: int
    leading: list[ops.Op]  # the input normalisation before node ``first``: on the box
    shapes: list[tuple[int, int, int]]  # each node's window (the crop graph's are flat)
    stride: list[tuple[int, int]]  # window start = position * stride + offset
    offset: list[tuple[int, int]]
    zero_fill: list[bool]  # out-of-range positions are 0 (else -TINY)


def crops_for(graph: BoundGraph, j: int) -> Crops | None:
    """The crops of node ``j`` when its neurons' receptive fields are small and every op
    up to it is a chain this module crops exactly (cached on the graph); else None."""
    if not _ENABLED.get():
        return None
    cache = graph.__dict__.setdefault("_crops", {})
    if j not in cache:
        cache[j] = _build(graph, j)
    return cache[j]


def _leading(graph: BoundGraph, j: int) -> int:
    """The last node of the elementwise ops (normalisation) straight after the input."""
    first = 0
    while first < j and graph.ops[first + 1].kind == "elementwise":
        first += 1
    return first


def _croppable(graph: BoundGraph, first: int, j: int) -> bool:
    if len(graph.ops[j].out_shape) != 3 or not graph.relu_only or first == j:
        return False
    for i in range(first + 1, j + 1):
        op = graph.ops[i]
        if op.inputs != [i - 1] or op.kind not in {"conv", "activation", "elementwise"}:
            return False
        if op.kind == "elementwise" and not all(_per_channel(t) for t in (op.scale, op.shift)):
            return False
        padded = op.kind == "conv" and any(op.padding)
        reads = graph.ops[i - 1]
        relu = reads.kind == "activation" and reads.relaxation is RELU
        if padded and i - 1 > first and not relu:
            return False
    return True


def _per_channel(t: torch.Tensor) -> bool:
    return t.dim() == 3 and bool((t == t[:, :1, :1]).all())


def _build(graph: BoundGraph, j: int) -> Crops | None:
    first = _leading(graph, j)
    if not _croppable(graph, first, j):
        return None
    n = j - first + 1
    size, stride, offset = [(1, 1)] * n, [(1, 1)] * n, [(0, 0)] * n
    for i in range(n - 1, 0, -1):
        op = graph.ops[first + i]
        size[i - 1], stride[i - 1], offset[i - 1] = size[i], stride[i], offset[i]
        if op.kind == "conv":
            size[i - 1] = _in_size(op, size[i])
            stride[i - 1] = tuple(stride[i][d] * op.stride[d] for d in (0, 1))
            offset[i - 1] = tuple(offset[i][d] * op.stride[d] - op.padding[d] for d in (0, 1))
    whole = graph.ops[first].out_shape[1] * graph.ops[first].out_shape[2]
    if size[0][0] * size[0][1] > SHARE * whole:
        return None
    chain = graph.ops[first : j + 1]
    shapes = [(op.out_shape[0], *size[i]) for i, op in enumerate(chain)]
    cropped = [ops.Input("crop", [], (math.prod(shapes[0]),))]
    for i, op in enumerate(chain[1:], 1):
        cropped.append(_flat_op(op, shapes[i - 1], shapes[i], i - 1))
    if any(op.kind == "dense" and op.weight.numel() > LARGEST for op in cropped):
        return None
    zero_fill = [True] + [op.kind != "activation" for op in chain[1:]]
    for i, op in enumerate(chain[1:], 1):
        if op.kind == "activation":  # its input pads as a stably inactive ReLU
            zero_fill[i - 1] = False
    crop = BoundGraph(cropped, graph.model, graph.dtype)
    return Crops(crop, first, graph.ops[1 : first + 1], shapes, stride, offset, zero_fill)


def _flat_op(op: ops.Op, in_shape: tuple[int, ...], shape: tuple[int, ...], reads: int) -> ops.Op:
    """``op`` on the crop, on flat vectors: a convolution as the dense matrix of its
    unpadded map (every entry a weight or zero, so exact in any dtype that holds them)."""
    n = math.prod(shape)
    if op.kind == "conv":
        basis = torch.eye(math.prod(in_shape), dtype=op.weight.dtype).reshape(-1, *in_shape)
        columns = F.conv2d(basis, op.weight.detach(), None, op.stride, 0, op.dilation, op.groups)
        bias = op.bias.detach().repeat_interleave(n // shape[0])
        return ops.Dense(op.name, [reads], (n,), weight=columns.reshape(-1, n).T.contiguous(),
                         bias=bias)  # fmt: skip
    new = copy.copy(op)
    new.inputs, new.out_shape = [reads], (n,)
    if op.kind == "elementwise":
        new.scale = op.scale[:, :1, :1].expand(shape).reshape(-1)
        new.shift = op.shift[:, :1, :1].expand(shape).reshape(-1)
    return new


def _in_size(op: ops.Conv, size: tuple[int, int]) -> tuple[int, int]:
    k = op.weight.shape[2:]
    return tuple((size[d] - 1) * op.stride[d] + op.dilation[d] * (k[d] - 1) + 1 for d in (0, 1))


def crop_boxes(
    crops: Crops, boxes: list[Box], samples: torch.Tensor, positions: torch.Tensor
) -> list[Box]:
    """The boxes of the chain's nodes, flat, on the windows of the (sample, position of node
    ``j``) pairs ``samples`` (N,) and ``positions`` (N, 2); out-of-range positions filled as
    the module docstring says; the first is the input box through the normalisation,
    widened by its rounding."""
    out = []
    chain = [_normalised(crops, boxes)] + boxes[crops.first + 1 : crops.first + len(crops.stride)]
    for i, (lo, hi) in enumerate(chain):
        fill = 0.0 if crops.zero_fill[i] else -TINY
        args = (samples, positions, crops.stride[i], crops.offset[i], crops.shapes[i][1:], fill)
        out.append((_windows(lo, *args).flatten(1), _windows(hi, *args).flatten(1)))
    return out


def _normalised(crops: Crops, boxes: list[Box]) -> Box:
    """The input box through the leading elementwise ops (exact on a box), each widened by
    2^-50 (|x scale| + |shift|), more than its two float64 roundings."""
    lo, hi = boxes[0]
    for op in crops.leading:
        reach = torch.maximum(lo.abs(), hi.abs()) * op.scale.abs() + op.shift.abs()
        lo, hi = op.interval((lo, hi))
        lo, hi = lo - reach * 2.0**-50, hi + reach * 2.0**-50
    return lo, hi


def _windows(
    t: torch.Tensor,
    samples: torch.Tensor,
    positions: torch.Tensor,
    stride: tuple[int, int],
    offset: tuple[int, int],
    window: tuple[int, int],
    fill: float,
) -> torch.Tensor:
    """The windows (N, C, h, w) of ``t`` (B, C, H, W) at ``samples`` starting at
    ``positions * stride + offset``; positions outside ``t`` hold ``fill``."""
    b, c, height, width = t.shape
    starts = [positions[:, d] * stride[d] + offset[d] for d in (0, 1)]
    pad = [max(0, -int(starts[d].min()), int(starts[d].max()) + window[d] - t.shape[2 + d])
           for d in (0, 1)]  # fmt: skip
    padded = t.new_full((b, c, height + 2 * pad[0], width + 2 * pad[1]), fill)
    padded[:, :, pad[0] : pad[0] + height, pad[1] : pad[1] + width] = t
    rows = (starts[0] + pad[0]).unsqueeze(1) + torch.arange(window[0])  # (N, h)
    cols = (starts[1] + pad[1]).unsqueeze(1) + torch.arange(window[1])  # (N, w)
    cut = padded[samples[:, None, None], :, rows[:, :, None], cols[:, None, :]]  # (N, h, w, C)
    return cut.permute(0, 3, 1, 2)
