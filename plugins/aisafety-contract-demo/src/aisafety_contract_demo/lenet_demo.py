"""A small LeNet-style network for 28x28 grey images, as an ``Architecture`` record.

A plan loads a state dict into it with ``source: checkpoint, architecture: lenet-demo``.
The weights expect the MNIST normalisation outside the module (``mean``/``std`` below), so
the record, not the module, says how inputs are scaled: the predictor applies it.
"""

from __future__ import annotations

from torch import nn

from aisafety.plugin import Architecture


def lenet() -> nn.Module:
    """conv 5x5 (6) - pool - conv 5x5 (16) - pool - 120 - 84 - 10, ReLU between."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )  # fmt: skip


LENET_DEMO = Architecture(
    name="lenet-demo",
    factory=lenet,
    input_shape=(1, 28, 28),
    num_classes=10,
    mean=(0.1307,),
    std=(0.3081,),
    description="LeNet-5-style CNN for 28x28 grey images (a plugin from aisafety.plugin)",
)
