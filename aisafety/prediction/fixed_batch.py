"""Running a network that accepts only one batch size on any number of images.

An exported program or a traced TorchScript module can be fixed to the batch it was made
with. The images are cut into batches of that size, the last one padded by repeating its
last image, and the padding rows are dropped from the outputs: each real image's output is
the one the network gives it in a batch of its own size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def fixed_batches(x: torch.Tensor, batch: int) -> list[tuple[torch.Tensor, int]]:
    """``x`` cut into batches of ``batch``, the last one padded; each with its real count."""
    out = []
    for chunk in x.split(batch):
        real = len(chunk)
        if real < batch:
            chunk = torch.cat([chunk, chunk[-1:].expand(batch - real, *chunk.shape[1:])])
        out.append((chunk, real))
    return out


def run_fixed(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch: int):
    """``forward`` on ``x`` in batches of ``batch``, without the padding rows."""
    return torch.cat([forward(chunk)[:real] for chunk, real in fixed_batches(x, batch)])
