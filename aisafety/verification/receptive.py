"""Intermediate bounds of a convolution's neurons on their receptive fields only.

A backward pass from one neuron of a convolution layer has nonzero coefficients only on
that neuron's receptive field, yet a dense pass carries them over every pixel of every
layer: on the zoo's Conv-Small (28x28 input, two 4x4 stride-2 convolutions) a neuron of
the second layer sees 10x10 of the 28x28 input pixels and 4x4 of the first layer's 14x14
positions. auto_LiRPA keeps such coefficients as "patches" (one kernel per output
position). Here the same saving comes from the dense machinery itself: for a chain of
convolutions, ReLUs, per-channel affine ops and unpadded max-pools ending at node ``j``
(after the input's normalisation, reshapes and permutations, which go onto the box), every
output position of ``j`` is one *sample* of a cropped copy of the chain, whose input is the
receptive field and whose convolutions have no padding. A max-pool window's field is the
union of its inputs' fields, so it composes like a convolution whose kernel is the pool's;
with a max-pool, or a convolution whose dense matrix on the crop is large, the crop keeps
(C, h, w) windows and the ops themselves, else it runs on flat vectors. ``bounds._tighten``
then bounds each position's unstable channels on its crop, with the same rules, rounding
margins and memory budget.

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
    shapes: list[tuple[int, int, int]]  # each node's window
    stride: list[tuple[int, int]]  # window start = position * stride + offset
    offset: list[tuple[int, int]]
    zero_fill: list[bool]  # out-of-range positions are 0 (else -TINY)
    flat: bool = True  # the crop graph's nodes are flat vectors (else (C, h, w) windows)


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
    """The last node of the ops straight after the input that a box passes exactly or with
    a known rounding: elementwise ops (normalisation), reshapes and permutations (the
    transposes around an NHWC graph)."""
    first = 0
    while (
        first < j
        and graph.ops[first + 1].inputs == [first]
        and (graph.ops[first + 1].kind == "elementwise" or _moves_values(graph.ops[first + 1]))
    ):
        first += 1
    return first


def _moves_values(op: ops.Op) -> bool:
    """A reshape or a permutation: its box is the input box's values moved, no arithmetic."""
    return op.kind == "reshape" or (op.kind == "positive-linear" and op.permutation)


def _croppable(graph: BoundGraph, first: int, j: int) -> bool:
    if len(graph.ops[j].out_shape) != 3 or not graph.relu_only or first == j:
        return False
    if len(graph.ops[first].out_shape) != 3:
        return False
    for i in range(first + 1, j + 1):
        op = graph.ops[i]
        if op.inputs != [i - 1] or op.kind not in {"conv", "activation", "elementwise", "maxpool"}:
            return False
        if op.kind == "elementwise" and not all(_per_channel(t) for t in (op.scale, op.shift)):
            return False
        # a window past the edge of a max-pool's input is -inf there, not a filled value
        if op.kind == "maxpool" and (any(op.padding) or op.ceil_mode):
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
        if op.kind in {"conv", "maxpool"}:  # a max-pool window: a kernel = stride conv's
            size[i - 1] = _in_size(op, size[i])
            stride[i - 1] = tuple(stride[i][d] * op.stride[d] for d in (0, 1))
            offset[i - 1] = tuple(offset[i][d] * op.stride[d] - op.padding[d] for d in (0, 1))
    whole = graph.ops[first].out_shape[1] * graph.ops[first].out_shape[2]
    if size[0][0] * size[0][1] > SHARE * whole:
        return None
    chain = graph.ops[first : j + 1]
    shapes = [(op.out_shape[0], *size[i]) for i, op in enumerate(chain)]
    flat = not _spatial(chain, shapes)
    make = _flat_op if flat else _spatial_op
    cropped = [ops.Input("crop", [], (math.prod(shapes[0]),) if flat else shapes[0])]
    for i, op in enumerate(chain[1:], 1):
        cropped.append(make(op, shapes[i - 1], shapes[i], i - 1))
    zero_fill = [True] + [op.kind != "activation" for op in chain[1:]]
    for i, op in enumerate(chain[1:], 1):
        if op.kind == "activation":  # its input pads as a stably inactive ReLU
            zero_fill[i - 1] = False
    crop = BoundGraph(cropped, graph.model, graph.dtype)
    leading = graph.ops[1 : first + 1]
    return Crops(crop, first, leading, shapes, stride, offset, zero_fill, flat)


def _spatial(chain: list[ops.Op], shapes: list[tuple[int, int, int]]) -> bool:
    """Whether the crop keeps its nodes' (C, h, w) shapes and convolutions: with max-pooling,
    or where a convolution's dense matrix on the crop would be larger than ``LARGEST`` (a
    3x3 convolution's is mostly zeros: on a 64-channel 8x8 crop 7x the products of the
    convolution itself). Else the crop runs on flat vectors, its convolutions as dense
    matrices (faster on the small crops of a strided net: one matrix product per layer)."""
    if any(op.kind == "maxpool" for op in chain):
        return True
    sizes = [math.prod(shape) for shape in shapes]
    return any(
        op.kind == "conv" and sizes[i] * sizes[i + 1] > LARGEST for i, op in enumerate(chain[1:])
    )


def _spatial_op(
    op: ops.Op, in_shape: tuple[int, ...], shape: tuple[int, ...], reads: int
) -> ops.Op:
    """``op`` on the crop, on (C, h, w) windows: a convolution without its padding (the
    crop's boxes hold the padding), a per-channel elementwise op's constants on the window."""
    new = copy.copy(op)
    new.inputs, new.out_shape = [reads], shape
    if op.kind in {"conv", "maxpool"}:
        new.in_shape = in_shape
    if op.kind == "conv":
        new.padding = (0, 0)
    if op.kind == "elementwise":
        new.scale = op.scale[:, :1, :1].expand(shape).contiguous()
        new.shift = op.shift[:, :1, :1].expand(shape).contiguous()
    return new


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


def _in_size(op: ops.Op, size: tuple[int, int]) -> tuple[int, int]:
    """The input window under a ``size`` window of a convolution's or a max-pool's output."""
    k = op.weight.shape[2:] if op.kind == "conv" else op.kernel
    return tuple((size[d] - 1) * op.stride[d] + op.dilation[d] * (k[d] - 1) + 1 for d in (0, 1))


def crop_boxes(
    crops: Crops, boxes: list[Box], samples: torch.Tensor, positions: torch.Tensor
) -> list[Box]:
    """The boxes of the chain's nodes (flat where the crop is) on the windows of the
    (sample, position of node ``j``) pairs ``samples`` (N,) and ``positions`` (N, 2);
    out-of-range positions filled as the module docstring says; the first is the input box
    through the leading ops, widened by their rounding."""
    out = []
    chain = [_normalised(crops, boxes)] + boxes[crops.first + 1 : crops.first + len(crops.stride)]
    for i, (lo, hi) in enumerate(chain):
        fill = 0.0 if crops.zero_fill[i] else -TINY
        args = (samples, positions, crops.stride[i], crops.offset[i], crops.shapes[i][1:], fill)
        lo, hi = _windows(lo, *args), _windows(hi, *args)
        out.append((lo.flatten(1), hi.flatten(1)) if crops.flat else (lo, hi))
    return out


def _normalised(crops: Crops, boxes: list[Box]) -> Box:
    """The input box through the leading ops: a reshape or permutation moves its values
    (exact); an elementwise op is exact on a box up to rounding, so its box is widened by
    2^-50 (|x scale| + |shift|), more than its two float64 roundings."""
    lo, hi = boxes[0]
    for op in crops.leading:
        if _moves_values(op):
            lo, hi = op.interval((lo, hi))
            continue
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
