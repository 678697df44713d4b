"""What one unit of work cost: wall and CPU seconds, and the peak memory while it ran.

A user sizing a run at their scale (a CIFAR-10 ResNet, an ImageNet batch) needs each unit's
time and peak memory, not only the run's (issue #32). The peak is the process's peak
resident size (``VmHWM``), reset when the unit starts through ``/proc/self/clear_refs``
(Linux), so it is this unit's peak and includes what was already resident (the model, the
data): the memory the unit needed the machine to have. Where the reset is not allowed (not
Linux, or a kernel without it) the peak is unknown (``None``) rather than the process's
lifetime peak, which would charge one unit with another's. On a CUDA device the allocator's
peak is reset and read the same way. Units that run at once in one process (threads) share
one peak: it is then the peak of their overlap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class UnitCost:
    seconds: float  # wall
    cpu_seconds: float  # this process, every thread
    peak_rss_mib: float | None  # peak resident size while the unit ran
    peak_gpu_mib: float | None  # peak CUDA allocation while it ran; None without CUDA


class CostMeter:
    """Started when the unit starts; ``read()`` gives what it cost so far."""

    def __init__(self) -> None:
        import torch  # here: the store reads UnitCost's fields without torch (aisafety report)

        self._gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self._gpu:
            torch.cuda.reset_peak_memory_stats()
        self._peak = reset_peak_rss()
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def read(self) -> UnitCost:
        import torch

        gpu = torch.cuda.max_memory_allocated() / 2**20 if self._gpu else None
        return UnitCost(
            seconds=time.perf_counter() - self._wall,
            cpu_seconds=time.process_time() - self._cpu,
            peak_rss_mib=status_bytes("VmHWM") / 2**20 if self._peak else None,
            peak_gpu_mib=gpu,
        )


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current resident size; False where the kernel does not allow."""
    try:
        CLEAR_REFS.write_text("5")
        return status_bytes("VmHWM") > 0
    except OSError:
        return False


def status_bytes(key: str) -> int:
    """A size line of ``/proc/self/status`` (``VmRSS``, ``VmHWM`` ...) in bytes; 0 where
    unreadable. The benches and tests that measure a call's own peak read it here too."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
