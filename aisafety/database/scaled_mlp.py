"""Seeded dense nets with every parameter scaled: the small steep nets on which the
verifiers' tests and benches check bounds. They live here, once, so that a test and a bench
build the same weights from the same call without one importing the other."""

from __future__ import annotations

import torch
from torch import nn


def scaled_mlp(seed: int, scale: float, widths: list[int], acts: list[type]) -> nn.Module:
    """Flatten, then dense layers of ``widths`` with ``acts`` between them, initialised
    after ``torch.manual_seed(seed)``, every parameter times ``scale`` (steep enough that
    ReLUs are unstable and the curved parts of sigmoid/tanh are reached); in eval mode."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Flatten()]
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:], strict=False)):
        layers += [nn.Linear(n_in, n_out), *([acts[i]()] if i < len(acts) else [])]
    net = nn.Sequential(*layers)
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.mul_(scale)
    return net.eval()
