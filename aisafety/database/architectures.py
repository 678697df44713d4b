"""Network architectures the model zoo knows how to rebuild from a state dict."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from aisafety.errors import UnknownNameError


def mnist_cnn() -> nn.Module:
    """Small two-conv CNN (~170k parameters): fast enough to attack on a laptop CPU."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 100), nn.ReLU(),
        nn.Linear(100, 10),
    )  # fmt: skip


def mnist_cnn_strided() -> nn.Module:
    """mnist-cnn with stride-2 convolutions instead of max-pooling (~170k parameters).

    CROWN-IBP's backward bound needs layers it can relax linearly; like the small MNIST
    models of Zhang et al. (2020) this downsamples with strided convolutions.
    """
    return nn.Sequential(
        nn.Conv2d(1, 16, 4, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 4, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 100), nn.ReLU(),
        nn.Linear(100, 10),
    )  # fmt: skip


ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "mnist-cnn": mnist_cnn,
    "mnist-cnn-strided": mnist_cnn_strided,
}


def build(name: str) -> nn.Module:
    if name not in ARCHITECTURES:
        raise UnknownNameError("architecture", name, ARCHITECTURES)
    return ARCHITECTURES[name]()
