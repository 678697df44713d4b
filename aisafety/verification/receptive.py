"""Intermediate bounds of a convolution's neurons on their receptive fields only.

A backward pass from one neuron of a convolution layer has nonzero coefficients only on
that neuron's receptive field, yet a dense pass carries them over every pixel of every
layer: on the zoo's Conv-Small (28x28 input, two 4x4 stride-2 convolutions) a neuron of
the second layer sees 10x10 of the 28x28 input pixels and 4x4 of the first layer's 14x14
positions. auto_LiRPA keeps such coefficients as "patches" (one kernel per output
position). Here the same saving comes from the dense machinery itself: for the ops that
node ``j`` depends on back to the input's normalisation (convolutions, ReLUs, per-channel
affine ops, unpadded max-pools and residual additions; the normalisation, reshapes and
permutations go onto the box), every output position of ``j`` is one *sample* of a cropped
copy of those ops, whose input is the receptive field and whose convolutions have no
padding. A max-pool window's field is the union of its inputs' fields, so it composes like
a convolution whose kernel is the pool's. A node that both branches of a residual block
read holds the union of the windows they need (they must agree on the stride); the branch
that needs less reads its sub-window through ``ops.Window`` (a copy). With a max-pool, or
convolutions whose dense matrices on the crop are large or mostly zeros (``_spatial``), the
crop keeps (C, h, w) windows and the ops themselves, else it runs on flat vectors.
``bounds._tighten`` then bounds each position's unstable channels on its crop, with the
same rules, rounding margins and memory budget.

Padding is what needs care. A crop that reaches past the edge of a node covers positions
that do not exist there; the convolution reading that node pads them with zeros. The crop's
boxes hold exactly that: the input's padding is the box [0, 0], and a padded ReLU output
(the only other node a padded convolution may read here) is [0, 0] with its ReLU input box
at [-TINY, -TINY], a stably inactive ReLU whose relaxation (slopes 0, intercepts 0) zeroes
the coefficients there, so the garbage the cropped convolution computes at those positions
is multiplied by zero. Every other op maps an output position inside its node to input
positions inside theirs, so no other nonzero coefficient reaches past an edge (a node that
a padded convolution and a ReLU both read would need both fills: kept dense). The bound of
each neuron is therefore the dense pass's, summed in a different order
(tests/test_receptive.py, tests/test_receptive_residual.py).
"""

from __future__ import annotations

import copy
import math
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aisafety.scoped import scoped
from aisafety.verification import ops
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.relaxations import RELU

TINY = 1e-30  # a padded ReLU input: stably inactive, and float32 holds it
# crop only where a neuron's receptive field is at most this share of the input
SHARE = 0.75
LARGEST = 1 << 22  # elements of a cropped convolution's dense matrix
# a crop keeps its convolutions where their dense matrices take this many times their
# products (a convolution on a small window runs ~5x slower per product than a matrix
# product; at 8 small-resnet's crops would change layout too, moving its bounds by
# rounding either way: docs/certification.md)
SPATIAL_RATIO = 16
_ENABLED: ContextVar[bool] = ContextVar("receptive_crops", default=True)


def dense_passes() -> AbstractContextManager[bool]:
    """Bound every neuron with dense passes inside this block (tests, the bench)."""
    return scoped(_ENABLED, False)


@dataclass
class Window:
    """Where a node of the crop graph lies on node ``source`` of the graph: the window of
    shape ``shape`` (C, h, w) starting at ``position * stride + offset``; positions outside
    that node hold ``fill``."""

    source: int
    shape: tuple[int, int, int]
    stride: tuple[int, int]
    offset: tuple[int, int]
    fill: float


@dataclass
class Crops:
    """The crop graph of node ``j``'s neurons: ``windows[i]`` says which node of the graph
    crop node ``i`` windows (node 0 is node ``first``, its input; the last is ``j``)."""

    graph: BoundGraph
    first: int
    leading: list[ops.Op]  # the input normalisation before node ``first``: on the box
    windows: list[Window]
    flat: bool = True  # the crop graph's nodes are flat vectors (else (C, h, w) windows)

    @property
    def end(self) -> int:
        """Node ``j`` in the crop graph."""
        return len(self.graph.ops) - 1


def crops_for(graph: BoundGraph, j: int) -> Crops | None:
    """The crops of node ``j`` when its neurons' receptive fields are small and every op
    up to it is one this module crops exactly (cached on the graph); else None."""
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


def _ancestors(graph: BoundGraph, first: int, j: int) -> list[int] | None:
    """The nodes from ``first`` to ``j`` that ``j`` depends on, in order; None when one of
    them reads a node before ``first`` (or ``first`` is not among them)."""
    found, todo = {j}, [j]
    while todo:
        i = todo.pop()
        if i == first:
            continue
        for k in graph.ops[i].inputs:
            if k < first:
                return None
            if k not in found:
                found.add(k)
                todo.append(k)
    return sorted(found) if first in found else None


def _croppable(graph: BoundGraph, first: int, nodes: list[int]) -> bool:
    """Every op of the crop is one cropped exactly, and every padded convolution reads the
    input or a ReLU (the only nodes whose out-of-range fill is what padding reads)."""
    j = nodes[-1]
    if len(graph.ops[j].out_shape) != 3 or not graph.relu_only or first == j:
        return False
    if len(graph.ops[first].out_shape) != 3:
        return False
    for i in nodes[1:]:
        op = graph.ops[i]
        if op.kind not in {"conv", "activation", "elementwise", "maxpool", "add"}:
            return False
        if op.kind == "elementwise" and not all(_per_channel(t) for t in (op.scale, op.shift)):
            return False
        # a window past the edge of a max-pool's input is -inf there, not a filled value
        if op.kind == "maxpool" and (any(op.padding) or op.ceil_mode):
            return False
        if op.kind == "conv" and any(op.padding):
            reads = op.inputs[0]
            relu = graph.ops[reads].kind == "activation" and graph.ops[reads].relaxation is RELU
            if reads != first and not relu:
                return False
    return True


def _per_channel(t: torch.Tensor) -> bool:
    return t.dim() == 3 and bool((t == t[:, :1, :1]).all())


Need = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]  # size, stride, offset


def _needs(op: ops.Op, need: Need) -> Need:
    """The window of an input that ``op`` reads for its output window ``need``."""
    size, stride, offset = need
    if op.kind not in {"conv", "maxpool"}:  # elementwise, activation, add: the same window
        return need
    # a max-pool window: a kernel = stride convolution's
    return (
        _in_size(op, size),
        tuple(stride[d] * op.stride[d] for d in (0, 1)),
        tuple(offset[d] * op.stride[d] - op.padding[d] for d in (0, 1)),
    )


def _union(a: Need | None, b: Need) -> Need | None:
    """The smallest window holding the windows ``a`` and ``b`` (None: their strides differ,
    so no window of one stride holds both)."""
    if a is None:
        return b
    if a[1] != b[1]:
        raise _Uncroppable
    low = tuple(min(a[2][d], b[2][d]) for d in (0, 1))
    high = tuple(max(a[2][d] + a[0][d], b[2][d] + b[0][d]) for d in (0, 1))
    return tuple(high[d] - low[d] for d in (0, 1)), a[1], low


class _Uncroppable(Exception):
    """Two branches read one node on grids of different strides."""


def _windows_of(graph: BoundGraph, nodes: list[int]) -> dict[int, Need] | None:
    """Each node's window: what its readers in the crop need, united (a node read by two
    branches of a residual block holds both branches' windows)."""
    need: dict[int, Need | None] = {nodes[-1]: ((1, 1), (1, 1), (0, 0))}
    try:
        for i in reversed(nodes[1:]):
            op = graph.ops[i]
            for k in op.inputs:
                need[k] = _union(need.get(k), _needs(op, need[i]))
    except _Uncroppable:
        return None
    return need


def _fills(graph: BoundGraph, nodes: list[int]) -> dict[int, float] | None:
    """Each node's out-of-range fill: 0 (the input's padding, a ReLU's output there), or
    -TINY below a ReLU (stably inactive); None when a node needs both (a padded convolution
    and a ReLU read it)."""
    fill = {i: 0.0 for i in nodes}
    padded = set()
    for i in nodes[1:]:
        op = graph.ops[i]
        if op.kind == "activation":
            fill[op.inputs[0]] = -TINY
        if op.kind == "conv" and any(op.padding):
            padded.add(op.inputs[0])
    return None if any(fill[k] != 0.0 for k in padded) else fill


def _build(graph: BoundGraph, j: int) -> Crops | None:
    first = _leading(graph, j)
    nodes = _ancestors(graph, first, j)
    if nodes is None or not _croppable(graph, first, nodes):
        return None
    need, fill = _windows_of(graph, nodes), _fills(graph, nodes)
    if need is None or fill is None:
        return None
    size = need[first][0]
    whole = graph.ops[first].out_shape[1] * graph.ops[first].out_shape[2]
    if size[0] * size[1] > SHARE * whole:
        return None
    shape = {i: (graph.ops[i].out_shape[0], *need[i][0]) for i in nodes}
    flat = not _spatial(graph, nodes, shape)
    crop, windows = _crop_graph(graph, nodes, need, fill, shape, flat)
    return Crops(crop, first, graph.ops[1 : first + 1], windows, flat)


def _crop_graph(
    graph: BoundGraph,
    nodes: list[int],
    need: dict[int, Need],
    fill: dict[int, float],
    shape: dict[int, tuple[int, int, int]],
    flat: bool,
) -> tuple[BoundGraph, list[Window]]:
    """The crop graph of ``nodes`` on their windows ``need``, with a sub-window op before
    each reader that needs less of a node than its window (one per node and window), and
    where each of its nodes lies on the graph."""
    first = nodes[0]
    windows = [Window(first, shape[first], *need[first][1:], fill[first])]
    at = {first: 0}  # a node's (or a sub-window's: (node, need)) index in the crop graph
    start = (math.prod(shape[first]),) if flat else shape[first]
    cropped: list[ops.Op] = [ops.Input("crop", [], start)]
    for i in nodes[1:]:
        op, reads, in_shapes = graph.ops[i], [], []
        for k in op.inputs:
            wanted = _needs(op, need[i])
            in_shapes.append((shape[k][0], *wanted[0]))
            if wanted != need[k] and (k, wanted) not in at:  # a sub-window of node k
                at[k, wanted] = len(cropped)
                windows.append(Window(k, in_shapes[-1], *wanted[1:], fill[k]))
                cropped.append(_sub_window(op.name, at[k], need[k], wanted, shape[k][0], flat))
            reads.append(at[k] if wanted == need[k] else at[k, wanted])
        at[i] = len(cropped)
        windows.append(Window(i, shape[i], *need[i][1:], fill[i]))
        cropped.append((_flat_op if flat else _spatial_op)(op, in_shapes[0], shape[i], reads))
    return BoundGraph(cropped, graph.model, graph.dtype), windows


def _sub_window(name: str, reads: int, outer: Need, inner: Need, channels: int, flat: bool):
    """The crop op that picks window ``inner`` out of node ``reads``' window ``outer`` (same
    stride): a copy of values, exact."""
    (h, w), (dh, dw) = outer[0], tuple(inner[2][d] - outer[2][d] for d in (0, 1))
    rows = torch.arange(inner[0][0]) + dh
    cols = torch.arange(inner[0][1]) + dw
    grid = (torch.arange(channels)[:, None, None] * h + rows[:, None]) * w + cols
    shape = (grid.numel(),) if flat else tuple(grid.shape)
    return ops.Window(name, [reads], shape, index=grid.flatten())


def _spatial(graph: BoundGraph, nodes: list[int], shape: dict[int, tuple]) -> bool:
    """Whether the crop keeps its nodes' (C, h, w) shapes and convolutions: with max-pooling,
    where a convolution's dense matrix on the crop would be larger than ``LARGEST``, or where
    the dense matrices take ``SPATIAL_RATIO`` times the convolutions' products (a 3x3
    convolution's matrix is mostly zeros: on resnet_4b's 23x23-pixel crops 18.8x its
    products, and the spatial crop ~2.5x faster). Else the crop runs on flat vectors, its
    convolutions as dense matrices (faster on the small crops of a strided net: one matrix
    product per layer; Conv-Small's matrices take 2.8x the products)."""
    if any(graph.ops[i].kind == "maxpool" for i in nodes):
        return True
    matrices = products = 0
    for i in nodes[1:]:
        op = graph.ops[i]
        if op.kind == "conv":
            window = _needs(op, (shape[i][1:], (1, 1), (0, 0)))[0]
            entries = math.prod(window) * shape[op.inputs[0]][0] * math.prod(shape[i])
            if entries > LARGEST:
                return True
            matrices += entries
            products += math.prod(shape[i]) * op.weight[0].numel()
    return matrices > SPATIAL_RATIO * products


def _spatial_op(
    op: ops.Op, in_shape: tuple[int, ...], shape: tuple[int, ...], reads: list[int]
) -> ops.Op:
    """``op`` on the crop, on (C, h, w) windows: a convolution without its padding (the
    crop's boxes hold the padding), a per-channel elementwise op's constants on the window."""
    new = copy.copy(op)
    new.inputs, new.out_shape = reads, shape
    if op.kind in {"conv", "maxpool"}:
        new.in_shape = in_shape
    if op.kind == "conv":
        new.padding = (0, 0)
    if op.kind == "elementwise":
        new.scale = op.scale[:, :1, :1].expand(shape).contiguous()
        new.shift = op.shift[:, :1, :1].expand(shape).contiguous()
    return new


def _flat_op(
    op: ops.Op, in_shape: tuple[int, ...], shape: tuple[int, ...], reads: list[int]
) -> ops.Op:
    """``op`` on the crop, on flat vectors: a convolution as the dense matrix of its
    unpadded map (every entry a weight or zero, so exact in any dtype that holds them)."""
    n = math.prod(shape)
    if op.kind == "conv":
        basis = torch.eye(math.prod(in_shape), dtype=op.weight.dtype).reshape(-1, *in_shape)
        columns = F.conv2d(basis, op.weight.detach(), None, op.stride, 0, op.dilation, op.groups)
        bias = op.bias.detach().repeat_interleave(n // shape[0])
        return ops.Dense(op.name, reads, (n,), weight=columns.reshape(-1, n).T.contiguous(),
                         bias=bias)  # fmt: skip
    new = copy.copy(op)
    new.inputs, new.out_shape = reads, (n,)
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
    """The boxes of the crop graph's nodes (flat where the crop is) on the windows of the
    (sample, position of node ``j``) pairs ``samples`` (N,) and ``positions`` (N, 2);
    out-of-range positions filled as the module docstring says; node ``first``'s is the
    input box through the leading ops, widened by their rounding."""
    out = []
    for window in crops.windows:
        lo, hi = _normalised(crops, boxes) if window.source == crops.first else boxes[window.source]
        args = (samples, positions, window.stride, window.offset, window.shape[1:], window.fill)
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
