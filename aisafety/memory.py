"""Reuse freed memory for large temporaries instead of faulting it in anew at every step.

Attacks, bound passes and noise batches allocate and free the same large tensors at every
step. glibc serves an allocation above its mmap threshold (32 MiB at most) by a fresh
``mmap``, which the kernel page-faults and zeroes 4 KiB at a time, and unmaps it on
``free``. Measured, one thread: alpha-CROWN on ``sok-cnn-a-adv1`` (2 images, eps 0.1) spent
22 s of system time against 19 s of user time, 1.8-2.9 s with the blocks reused
(``bench/memory_reuse.py``); 20 PGD steps on ``mnist-cnn`` at batch 1,000 7.2 s user and
2.4-4.1 s system, 0.2 s system reused.

Inside the outermost ``reuse_freed_memory`` block (around each work unit of a run, each
attack call and each verify call) glibc's mmap threshold is 1 GiB and the heap is never
trimmed, so freed blocks stay in the heap and are reused. (A 1 GiB trim threshold, used
before, let glibc hand back the heap's top whenever more than 1 GiB of it was free: PGD-10
on 128 images of ``small-resnet`` at 224x224, whose backward pass frees about 2 GB of
activations at every step, faulted 9,211 pages per image back in, 18 ms of kernel time
per image beside 148 ms of user time, and none with trimming off; docs/scale.md.) At its
end ``malloc_trim`` hands the kept memory back (a process's resident size does not stay at
the peak) and the thresholds go back to
glibc's ceiling for its dynamic ones (32 MiB mmap, 64 MiB trim; ``mallopt`` cannot restore
the dynamic mode itself). Where the C library has no ``mallopt`` (macOS, musl) this does
nothing; CUDA memory has PyTorch's own caching allocator. ``AISAFETY_REUSE_FREED_MEMORY=0``
turns it off.

No block outlives its call (``open_blocks()`` is 0 between calls; the test suite checks it
after every test): the count goes up inside the block's ``try`` and down first in its
``finally``, with no call in between where CPython could run a signal handler, so a Ctrl-C,
SIGTERM (``terminate_as_interrupt``) or a forward's SIGALRM cannot leave it counted, and a
restore such an exception cuts short is run once more (docs/memory.md, session 17).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

INSIDE = 1 << 30  # bytes, the mmap threshold: a CNN's bound coefficients stay in the heap
NO_TRIM = -1  # glibc's trim threshold for "never trim" (mallopt(3))
AFTER = {"mmap": 32 << 20, "trim": 64 << 20}  # glibc's ceiling for its dynamic thresholds
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_depth = 0  # nesting of reuse_freed_memory blocks, process-wide
_lock = threading.Lock()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, when it is glibc-like (has ``mallopt`` and ``malloc_trim``)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def _enabled() -> bool:
    return os.environ.get("AISAFETY_REUSE_FREED_MEMORY", "1") != "0"


@contextmanager
def reuse_freed_memory() -> Iterator[None]:
    """Inside: large freed blocks are kept for reuse. Re-entrant (the outermost block decides)."""
    libc = _libc() if _enabled() else None
    if libc is None:
        yield
        return
    global _depth
    counted = False
    try:
        with _lock:
            _depth += 1
            counted = True  # no call between the two lines: no signal handler runs there
            if _depth == 1:
                _set_thresholds(libc, INSIDE, NO_TRIM)
        yield
    finally:
        if counted:  # nothing before the decrement runs a signal handler either
            with _lock:
                _depth -= 1
                if _depth == 0:
                    try:
                        _set_thresholds(libc, AFTER["mmap"], AFTER["trim"])
                    except BaseException:  # a signal handler's exception cut it short
                        _set_thresholds(libc, AFTER["mmap"], AFTER["trim"])
                        raise
                    libc.malloc_trim(ctypes.c_size_t(0))


def open_blocks() -> int:
    """How many ``reuse_freed_memory`` blocks are open in the process: 0 between calls (the
    test suite checks it after every test)."""
    return _depth


def _set_thresholds(libc: ctypes.CDLL, mmap: int, trim: int) -> None:
    libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(mmap))
    libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(trim))
