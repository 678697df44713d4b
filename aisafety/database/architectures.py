"""Network architectures the model zoo knows how to rebuild from a state dict."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from aisafety.database.denoiser import DenoisedClassifier, Denoiser
from aisafety.database.thermometer import ThermometerEncoding
from aisafety.errors import UnknownNameError
from aisafety.interfaces import Architecture


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


def mnist_cnn_thermometer(levels: int = 16) -> nn.Module:
    """mnist-cnn reading a thermometer encoding of its input: ``levels`` channels per pixel
    (Buckman et al. 2018 use 16 levels on MNIST). Train it with mean 0 and std 1: the
    encoding needs pixel values in [0, 1]."""
    return nn.Sequential(
        ThermometerEncoding(levels),
        nn.Conv2d(levels, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 100), nn.ReLU(),
        nn.Linear(100, 10),
    )  # fmt: skip


def hgd_mnist_cnn() -> nn.Module:
    """HGD: a small U-Net denoiser in front of ``mnist-cnn`` (Liao et al. 2018)."""
    return DenoisedClassifier(Denoiser(), mnist_cnn())


def fcnn(*widths: int) -> nn.Module:
    """Flatten, then ReLU layers of ``widths`` and a 10-way linear head (MNIST input)."""
    sizes = [28 * 28, *widths]
    layers: list[nn.Module] = [nn.Flatten()]
    for fan_in, fan_out in zip(sizes, sizes[1:], strict=False):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], 10))


def fcnn_a() -> nn.Module:
    """The SoK benchmark's FCNNa: 2 x [20] (16,330 parameters, as the SoK lists)."""
    return fcnn(20, 20)


def fcnn_b() -> nn.Module:
    """The SoK benchmark's FCNNb: 3 x [100] (99,710 parameters, as the SoK lists)."""
    return fcnn(100, 100, 100)


ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "mnist-cnn": mnist_cnn,
    "mnist-cnn-strided": mnist_cnn_strided,
    "mnist-cnn-thermometer-16": mnist_cnn_thermometer,
    "hgd-mnist-cnn": hgd_mnist_cnn,
    "fcnn-a": fcnn_a,
    "fcnn-b": fcnn_b,
}


def builtin_architectures() -> list[Architecture]:
    """The zoo's architectures as the records the ``aisafety_architectures`` hook returns:
    MNIST-shaped, ten classes; the normalisation is each zoo model's (its manifest)."""
    return [
        Architecture(
            name,
            factory,
            (1, 28, 28),
            10,
            description=(factory.__doc__ or "").strip().splitlines()[0],
        )  # fmt: skip
        for name, factory in ARCHITECTURES.items()
    ]


def build(name: str) -> nn.Module:
    if name not in ARCHITECTURES:
        raise UnknownNameError("architecture", name, ARCHITECTURES)
    return ARCHITECTURES[name]()
