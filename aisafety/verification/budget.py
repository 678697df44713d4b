"""The memory budget of bound propagation: estimated before any work, kept by chunking.

A backward pass from node ``s`` carries one coefficient tensor per bounded row, each the
size of the node it has reached: a CIFAR ResNet's first intermediate bound asked for one
tensor of 58 GB when every unstable neuron was bounded at once. So the rows (neurons of a
layer, spec rows) go through in chunks sized to the budget, and a verifier checks before
its first pass that the smallest chunk (one neuron, one sample) fits; if not it refuses
with ``MemoryBudgetError`` naming the estimate, the budget and what would fit.

The budget is the verifier's ``memory_gib`` or, by default, the budget every capability
shares (``aisafety/memory_budget.py``): the plan's ``limits.memory_gib``, else a fraction of
the available memory. Estimates count the
tensors live at once, per row and sample, at the graph's dtype: ``LIVE`` coefficient-sized
temporaries inside one op's backward rule, the coefficients pending on other nodes (the
skip branch of a residual block), and for alpha-CROWN's gradient pass the tensors autograd
keeps of every op (``SAVED``; a sigmoid's or tanh's float64 lines far more,
``SSHAPE_SAVED``) and the slopes' Adam state (``SLOPE_STATE``). The constants were
calibrated against the peak resident size (``tests/test_bound_budget.py``,
``tests/test_joint_bytes.py``).
"""

from __future__ import annotations

import math

from aisafety.errors import MemoryBudgetError
from aisafety.memory_budget import (  # noqa: F401  (the budget every capability shares)
    FRACTION,
    GIB,
    available_bytes,
    budget_read_once,
    current_budget,
    default_budget,
    memory_limit,
    size,
)
from aisafety.verification.graph import BoundGraph
from aisafety.verification.relaxations import RELU

LIVE = 24  # coefficient-sized tensors in one backward rule, freed-block reuse included
SAVED = 9  # per op, kept by autograd for alpha-CROWN (measured: up to 7 with LIVE 6)
SLOPE_STATE = 5  # per unstable-ReLU slope: value, gradient, two Adam moments, best so far
# a slope search's chunk of rows takes at most this many bytes (estimated), whatever the
# budget: a larger chunk ran slower per row, in user time, not page faults (likely cache
# and memory traffic of its autograd state; resnet_2b at 1/255, node 11's crops, 4 images:
# 256 (image, position) pairs in one chunk 53.5 CPU s, chunks of 11-44 pairs 10.4-12.6 s,
# the same bounds; docs/cifar10.md)
SEARCH_CHUNK = 256 << 20
# per sigmoid/tanh element with per-row slopes, beside SAVED: its lines' float64 arithmetic
# that autograd keeps (``slope_range``, ``gaps``' four points; 735-791 bytes measured on
# sigmoid and tanh MLPs, bench/joint_bytes.py) and its second slope's state
SSHAPE_SAVED = 256 + SLOPE_STATE


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def box_bytes(graph: BoundGraph, batch: int) -> int:
    """The IBP boxes of every node (lower and upper), twice: a box and its refinement; and
    as much again for what the float32 passes keep on a box (its float32 copy, centre and
    columns: ``memo.py``, ``rounding.exact_shift``)."""
    sizes = sum(numel(op.out_shape) for op in graph.ops)
    return 8 * sizes * batch * graph.dtype.itemsize


def row_bytes(graph: BoundGraph, start: int, batch: int, grad: bool = False) -> int:
    """Peak bytes per spec row of a backward pass from node ``start`` over ``batch`` samples;
    ``grad``: with alpha-CROWN's slopes (float32 search, autograd state and Adam)."""
    if grad:
        return batch * 4 * _grad_elements(graph, start)
    return batch * graph.dtype.itemsize * _live_elements(graph, start)


def _live_elements(graph: BoundGraph, start: int) -> int:
    """The most coefficient elements alive at once while the pass is at one op; kept per
    graph and node (the loop is cubic in the ops, and CROWN asks once per pass)."""
    kept = graph.__dict__.setdefault("_live_elements", {})
    shapes = tuple((op.out_shape, tuple(op.inputs)) for op in graph.ops[: start + 1])
    if kept.get(start, (None,))[0] != shapes:
        kept[start] = (shapes, _count_live(graph, start))
    return kept[start][1]


def _count_live(graph: BoundGraph, start: int) -> int:
    peak = LIVE * numel(graph.input_shape)  # the concretisation at the input
    for i in range(start, 0, -1):
        op = graph.ops[i]
        rule = max([numel(op.out_shape)] + [numel(graph.ops[j].out_shape) for j in op.inputs])
        pending = sum(
            numel(graph.ops[k].out_shape)
            for k in range(i)
            if any(k in graph.ops[m].inputs for m in range(i + 1, start + 1))
        )
        peak = max(peak, LIVE * rule + pending)
    return peak


def _grad_elements(graph: BoundGraph, start: int) -> int:
    """Saved tensors of every op up to ``start``, the slopes' state and one rule's peak."""
    ops = graph.ops[: start + 1]
    saved = SAVED * sum(numel(op.out_shape) for op in ops)
    slopes = SLOPE_STATE * sum(numel(op.out_shape) for op in ops if op.kind == "activation")
    sshape = SSHAPE_SAVED * sum(numel(op.out_shape) for op in ops if is_sshape(op))
    return saved + slopes + sshape + _live_elements(graph, start)


def is_sshape(op) -> bool:
    """A sigmoid or tanh: its searched lines keep far more than a ReLU's (``SSHAPE_SAVED``)."""
    return op.kind == "activation" and op.relaxation is not RELU


def crop_pair_bytes(crop: BoundGraph, end: int, grad: bool = False) -> int:
    """Peak bytes of one (sample, position) pair of a receptive-field crop (``receptive.py``):
    its boxes and a pass of every channel of the position, two rows each."""
    channels = numel(crop.ops[end].out_shape)
    return box_bytes(crop, 1) + 2 * channels * row_bytes(crop, end, 1, grad)


def rows_per_chunk(per_row: int, rows: int, fixed: int = 0, most: int | None = None) -> int:
    """How many of ``rows`` rows fit the current budget at once (at least one), their own
    bytes at most ``most``."""
    room = current_budget() - fixed
    if most is not None:
        room = min(room, most)
    return max(1, min(rows, room // max(1, per_row)))


def search_chunk(alpha_steps: int) -> int | None:
    """``rows_per_chunk``'s ``most`` for a pass with ``alpha_steps`` of slope search."""
    return SEARCH_CHUNK if alpha_steps > 0 else None


def refuse(what: str, estimate: int, budget: int, fits: str) -> MemoryBudgetError:
    return MemoryBudgetError(
        f"{what} needs about {size(estimate)} at its smallest chunk, over the memory budget "
        f"of {size(budget)}; {fits}"
    )
