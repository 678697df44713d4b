"""The memory budget of bound propagation: estimated before any work, kept by chunking.

A backward pass from node ``s`` carries one coefficient tensor per bounded row, each the
size of the node it has reached: a CIFAR ResNet's first intermediate bound asked for one
tensor of 58 GB when every unstable neuron was bounded at once. So the rows (neurons of a
layer, spec rows) go through in chunks sized to the budget, and a verifier checks before
its first pass that the smallest chunk (one neuron, one sample) fits; if not it refuses
with ``MemoryBudgetError`` naming the estimate, the budget and what would fit.

The budget is the verifier's ``memory_gib`` or, by default, ``FRACTION`` of the memory the
kernel reports available (``MemAvailable`` in /proc/meminfo, capped by the process's
``RLIMIT_AS`` headroom), or of the free memory of the CUDA device. Estimates count the
tensors live at once, per row and sample, at the graph's dtype: ``LIVE`` coefficient-sized
temporaries inside one op's backward rule, the coefficients pending on other nodes (the
skip branch of a residual block), and for alpha-CROWN's gradient pass the tensors autograd
keeps of every op (``SAVED``) and the slopes' Adam state (``SLOPE_STATE``). The constants
were calibrated against the peak resident size (``tests/test_budget.py``).
"""

from __future__ import annotations

import math
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from aisafety.errors import MemoryBudgetError
from aisafety.verification.graph import BoundGraph

FRACTION = 0.5  # of the available memory: the rest is the process, the OS and neighbours
LIVE = 24  # coefficient-sized tensors in one backward rule, freed-block reuse included
SAVED = 9  # per op, kept by autograd for alpha-CROWN (measured: up to 7 with LIVE 6)
SLOPE_STATE = 5  # per unstable-ReLU slope: value, gradient, two Adam moments, best so far
GIB = 1 << 30

_CURRENT: ContextVar[int | None] = ContextVar("verification_memory_budget", default=None)


def available_bytes(device: torch.device | str = "cpu") -> int:
    """Memory this process can still take: the device's free memory on CUDA, else
    ``MemAvailable``, capped by the address-space limit (``ulimit -v``) left."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    free = _meminfo("MemAvailable")
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        free = min(free, max(0, limit - _vm_size()))
    return free


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/meminfo has no {key}")


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def default_budget(device: torch.device | str = "cpu") -> int:
    return int(FRACTION * available_bytes(device))


@contextmanager
def memory_limit(budget: int) -> Iterator[int]:
    """Bound passes inside this block chunk their rows to stay under ``budget`` bytes."""
    token = _CURRENT.set(int(budget))
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def current_budget() -> int:
    """The budget of the enclosing ``memory_limit``, else the default (read now)."""
    budget = _CURRENT.get()
    return default_budget() if budget is None else budget


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def box_bytes(graph: BoundGraph, batch: int) -> int:
    """The IBP boxes of every node (lower and upper), twice: a box and its refinement."""
    sizes = sum(numel(op.out_shape) for op in graph.ops)
    return 4 * sizes * batch * graph.dtype.itemsize


def row_bytes(graph: BoundGraph, start: int, batch: int, grad: bool = False) -> int:
    """Peak bytes per spec row of a backward pass from node ``start`` over ``batch`` samples;
    ``grad``: with alpha-CROWN's slopes (float32 search, autograd state and Adam)."""
    if grad:
        return batch * 4 * _grad_elements(graph, start)
    return batch * graph.dtype.itemsize * _live_elements(graph, start)


def _live_elements(graph: BoundGraph, start: int) -> int:
    """The most coefficient elements alive at once while the pass is at one op."""
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
    return saved + slopes + _live_elements(graph, start)


def rows_per_chunk(per_row: int, rows: int, fixed: int = 0) -> int:
    """How many of ``rows`` rows fit the current budget at once (at least one)."""
    room = current_budget() - fixed
    return max(1, min(rows, room // max(1, per_row)))


def size(n: int) -> str:
    """Bytes for a message: GiB, or MiB below a tenth of one."""
    return f"{n / GIB:.3g} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.3g} MiB"


def refuse(what: str, estimate: int, budget: int, fits: str) -> MemoryBudgetError:
    return MemoryBudgetError(
        f"{what} needs about {size(estimate)} at its smallest chunk, over the memory budget "
        f"of {size(budget)}; {fits}"
    )
