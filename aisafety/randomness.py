"""Random draws that are the same on every device: generated on the host, then moved.

CUDA's generators produce other numbers than the CPU's from the same seed, so a run on a GPU
would attack from other random starts, smooth with other noise and corrupt with other grain
than the same plan on a CPU, and its numbers could not be checked against the CPU run's (or
resumed on the other kind of machine). Every seeded draw of an evaluation therefore comes
from a CPU ``torch.Generator`` and is copied to the device: the values are bit-identical
everywhere, at the cost of generating them on the host (small next to the model passes that
use them; ``bench/gpu_speed.py`` times PGD with its random start against the floor).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Shape = Sequence[int] | torch.Size


def generator(seed: int) -> torch.Generator:
    """A host generator seeded with ``seed`` (for draws on any device)."""
    return torch.Generator().manual_seed(int(seed))


def rand(shape: Shape, generator: torch.Generator, device, dtype=None) -> torch.Tensor:
    """``torch.rand`` from a host generator, on ``device``."""
    return torch.rand(tuple(shape), generator=generator, dtype=dtype).to(device)


def randn(shape: Shape, generator: torch.Generator, device, dtype=None) -> torch.Tensor:
    """``torch.randn`` from a host generator, on ``device``."""
    return torch.randn(tuple(shape), generator=generator, dtype=dtype).to(device)


def randint(low: int, high: int, shape: Shape, generator: torch.Generator, device) -> torch.Tensor:
    """``torch.randint`` from a host generator, on ``device``."""
    return torch.randint(low, high, tuple(shape), generator=generator).to(device)
