"""Sliding windows over an image with scipy.ndimage's edge rule, shared by the local filters.

scipy's default ``mode='reflect'`` extends an image by mirroring it about its edge, the
edge pixel included (d c b a | a b c d). A window of ``size`` pixels covers offsets
``-(size // 2) .. size - 1 - size // 2`` around its pixel, as scipy's filters do with
``origin=0``; so even sizes (Xu et al. use 2x2 medians) line up with scipy too.
"""

from __future__ import annotations

import torch


def symmetric_pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """Pad the last two dims of ``x`` for a ``size`` x ``size`` window, mirroring the edge."""
    before, after = size // 2, size - 1 - size // 2
    rows = _mirror_index(x.shape[-2], before, after, x.device)
    cols = _mirror_index(x.shape[-1], before, after, x.device)
    return x.index_select(-2, rows).index_select(-1, cols)


def windows(x: torch.Tensor, size: int) -> torch.Tensor:
    """(N, C, H, W) -> (N, C, H, W, size * size): every pixel's padded neighbourhood."""
    padded = symmetric_pad(x, size)
    patches = padded.unfold(-2, size, 1).unfold(-2, size, 1)
    return patches.reshape(*x.shape, size * size)


def _mirror_index(length: int, before: int, after: int, device: torch.device) -> torch.Tensor:
    index = torch.arange(-before, length + after, device=device)
    period = 2 * length
    index = index % period  # the mirrored image repeats with period 2 * length
    return torch.where(index < length, index, period - 1 - index)
