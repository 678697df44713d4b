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


def sshape_net() -> nn.Module:
    """Sigmoid, tanh, sigmoid on 4x4 inputs, weights 4x PyTorch's default scale, so that
    pre-activations reach the curved parts: the S-shape verifiers' tests
    (tests/test_sshape_relaxation.py) and benches (bench/sigmoid_lines.py)."""
    return scaled_mlp(5, 4.0, [16, 20, 20, 12, 3], [nn.Sigmoid, nn.Tanh, nn.Sigmoid])


def smooth_net() -> nn.Module:
    """Sigmoid, tanh on 4x4 inputs, weights 3x: the verifier contract's smooth net
    (tests/test_contract.py) and the benches that measure it."""
    return scaled_mlp(1, 3.0, [16, 12, 8, 3], [nn.Sigmoid, nn.Tanh])
