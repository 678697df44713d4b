"""Thermometer encoding (Buckman, Roy, Raffel & Goodfellow, ICLR 2018) as a network layer.

Each pixel value v in [0, 1] becomes ``levels`` binary channels, channel k = 1[v >= k / levels]
(k = 0 .. levels - 1): Buckman et al.'s tau(b(v)), the quantised value b(v) written as a
thermometer (channel 0 is always on). The encoding is a step function, so the gradient an
attacker gets through it is zero almost everywhere: the defense's strength against white-box
PGD is obfuscated gradients. Athalye, Carlini & Wagner (ICML 2018, Sec. 5.2) break it with
BPDA: the forward pass keeps the real encoding, the backward pass runs through a continuous
one. Ours is the piecewise-linear ramp clip(levels * v - k + 1, 0, 1), which equals the real
encoding at every bucket edge and is its linear interpolation in between; switch it on with
``bpda(predictor)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def thresholds(levels: int, like: torch.Tensor) -> torch.Tensor:
    """k / levels for k = 0 .. levels - 1, shaped to broadcast against (N, C, levels, H, W)."""
    k = torch.arange(levels, dtype=like.dtype, device=like.device)
    return (k / levels).view(1, 1, levels, 1, 1)


def thermometer(x: torch.Tensor, levels: int) -> torch.Tensor:
    """(N, C, H, W) in [0, 1] -> (N, C, levels, H, W) of 0/1.

    Its gradient is zero, as PyTorch's for ``round`` (the comparison alone would cut the
    graph, and an attack differentiating through it would fail instead of seeing zero)."""
    spread = x.unsqueeze(2)
    return (spread >= thresholds(levels, x)).to(x.dtype) + 0 * spread


def soft_thermometer(x: torch.Tensor, levels: int) -> torch.Tensor:
    """The continuous encoding BPDA differentiates: clip(levels * (v - k / levels) + 1, 0, 1)."""
    return torch.clamp(levels * (x.unsqueeze(2) - thresholds(levels, x)) + 1, 0, 1)


def buckets(x: torch.Tensor, levels: int) -> torch.Tensor:
    """The quantisation level j of each value: the number of channels on, minus one."""
    return thermometer(x, levels).sum(2).long() - 1


def from_buckets(j: torch.Tensor, levels: int) -> torch.Tensor:
    """The encoding (N, C, levels, H, W) of bucket indices j (N, C, H, W)."""
    k = torch.arange(levels, device=j.device).view(1, 1, levels, 1, 1)
    return (k <= j.unsqueeze(2)).float()


class ThermometerEncoding(nn.Module):
    """(N, C, H, W) -> (N, C * levels, H, W); ``bpda`` switches the attacker's gradient to
    the soft encoding (values unchanged)."""

    def __init__(self, levels: int):
        super().__init__()
        self.levels = levels
        self.bpda = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hard = thermometer(x, self.levels)
        if self.bpda and torch.is_grad_enabled() and x.requires_grad:
            soft = soft_thermometer(x, self.levels)
            hard = soft + (hard - soft).detach()
        return hard.flatten(1, 2)

    def extra_repr(self) -> str:
        return f"levels={self.levels}, bpda={self.bpda}"


@contextmanager
def bpda(predictor: Any) -> Iterator[None]:
    """Within the block, every thermometer layer of ``predictor.network`` (a TorchPredictor's)
    gives attackers the BPDA gradient; the predictions are the same."""
    layers = [m for m in predictor.network.modules() if isinstance(m, ThermometerEncoding)]
    if not layers:
        raise ValueError(f"model {predictor.name!r} has no thermometer encoding layer for BPDA")
    for layer in layers:
        layer.bpda = True
    try:
        yield
    finally:
        for layer in layers:
            layer.bpda = False
