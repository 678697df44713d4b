"""Interleaved paired CPU timing, one thread: what the benches comparing two ways of computing
one thing share (the project's rule for speed figures: ratios from one run, interleaved,
paired medians, CPU time, with the CPU named)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from bab_speed import cpu_model


def one_thread() -> str:
    """Set torch to one thread; the words naming it, the CPU and the load, for a header."""
    torch.set_num_threads(1)
    return f"one thread; CPU {cpu_model()}; load {os.getloadavg()[0]:.1f}"


def interleaved(ways: Sequence[str], run: Callable[[str], Any], pairs: int) -> dict[str, list]:
    """Every way once (a warm-up), then ``pairs`` rounds of every way, the order reversed
    every other round so that drift cancels; each way's results in round order."""
    for way in ways:
        run(way)
    results: dict[str, list] = {way: [] for way in ways}
    for i in range(pairs):
        for way in list(ways)[:: 1 if i % 2 == 0 else -1]:
            results[way].append(run(way))
    return results


def paired_median(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the per-round ratios."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def compare_new_old(
    name: str, run: Callable[[str], tuple[float, torch.Tensor]], pairs: int
) -> None:
    """Print ``name``'s paired median of new/old CPU time (its range, old's last time) and
    the largest difference of the two ways' results; ``run("new" | "old")`` returns the
    seconds and the result of one call."""
    results = interleaved(("new", "old"), run, pairs)
    new, old = ([t for t, _ in results[way]] for way in ("new", "old"))
    ratios = [n / o for n, o in zip(new, old, strict=True)]
    diff = max(
        float((a - b).abs().max())
        for (_, a), (_, b) in zip(results["new"], results["old"], strict=True)
    )
    print(f"{name:<28} new/old {paired_median(new, old):.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}), old {old[-1]:.3f} s; results differ by <= {diff:.2g}",
          flush=True)  # fmt: skip
