"""The memory budget every capability keeps: estimated before any work, kept by chunking.

A computation that holds one large tensor per image (an attack's forward and backward
pass, a noisy batch of randomized smoothing, a layer's activations for neuron coverage, a
bound pass's coefficients) estimates its peak per chunk before it starts and takes chunks
that fit the budget; where even the smallest chunk does not fit it refuses with
``MemoryBudgetError``, naming the estimate, the budget and what would fit. Never a raw
allocator error after minutes of work, never the kernel's OOM killer.

The budget is the enclosing ``memory_limit`` (the plan's ``limits.memory_gib``, a
verifier's ``memory_gib``) or, by default, ``FRACTION`` of the memory the kernel reports
available (``MemAvailable`` in /proc/meminfo, less what other AISafety processes have
claimed and not yet taken, ``memory_ledger.py``; capped by the process's ``RLIMIT_AS``
headroom), or of the free memory of the CUDA device.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

import torch

from aisafety import memory_ledger
from aisafety.errors import MemoryBudgetError
from aisafety.scoped import scoped

FRACTION = 0.5  # of the available memory: the rest is the process, the OS and neighbours
GIB = 1 << 30

_CURRENT: ContextVar[int | None] = ContextVar("memory_budget", default=None)


def available_bytes(device: torch.device | str = "cpu", pending: int = 0) -> int:
    """Memory this process can still take: the device's free memory on CUDA, else
    ``MemAvailable`` less ``pending`` (what other processes claimed and have not taken yet,
    ``memory_ledger.py``), capped by the address-space limit (``ulimit -v``) left."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    free = max(0, _meminfo("MemAvailable") - pending)
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
    """``FRACTION`` of the available memory; on the CPU less what this user's other
    AISafety processes have claimed and not yet taken, and claimed in turn
    (``memory_ledger.py``): processes started together do not each count the same free
    memory."""
    if torch.device(device).type == "cuda":
        return int(FRACTION * available_bytes(device))
    return memory_ledger.claim(lambda pending: int(FRACTION * available_bytes(device, pending)))


def memory_limit(budget: int | None) -> AbstractContextManager[int | None]:
    """Work inside this block chunks to stay under ``budget`` bytes (None: the default)."""
    return scoped(_CURRENT, None if budget is None else int(budget))


@contextmanager
def budget_read_once(device: torch.device | str = "cpu") -> Iterator[int]:
    """Inside this block the budget is the one read (and claimed in the ledger) on entry,
    unless an enclosing ``memory_limit`` already fixes it. For one bound computation run
    outside ``Verifier.verify`` (which fixes its budget the same way): its passes take
    their chunks one after another, each freed before the next, so one claim covers the
    whole computation, as one claim covers a ``verify`` call. Reading the budget per chunk
    cost a locked read and write of the ledger each (0.5-1.7 ms, 2-10% of CROWN on a small
    MLP; docs/memory.md) and only renewed the same claim."""
    held = _CURRENT.get()
    if held is not None:
        yield held
        return
    with memory_limit(default_budget(device)) as budget:
        yield budget


def current_budget(device: torch.device | str = "cpu") -> int:
    """The budget of the enclosing ``memory_limit``, else the default (read now)."""
    budget = _CURRENT.get()
    return default_budget(device) if budget is None else budget


def size(n: int) -> str:
    """Bytes for a message: GiB, or MiB below a tenth of one."""
    return f"{n / GIB:.3g} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.3g} MiB"


def fitting(
    what: str,
    per_item: int,
    wanted: int,
    fits: str,
    device: torch.device | str = "cpu",
    fixed: int = 0,
) -> int:
    """How many of ``wanted`` items (images, noisy copies) fit the budget at once, at
    ``per_item`` bytes each beside ``fixed`` bytes; refuses before any work when not even
    one does. ``fits`` says what to change, e.g. "use a smaller batch"."""
    budget = current_budget(device)
    count = (budget - fixed) // max(1, per_item)
    if count < 1:
        held = f" beside {size(fixed)} for the whole call" if fixed else ""
        least = math.ceil((per_item + fixed) / GIB * 1000) / 1000  # GiB, rounded up
        raise MemoryBudgetError(
            f"{what} needs about {size(per_item)} at its smallest chunk{held}, over the "
            f"memory budget of {size(budget)} (the least that fits one chunk: memory_gib: "
            f"{least:g}); {fits}"
        )
    return int(min(wanted, count))
