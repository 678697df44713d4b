"""A network whose TorchScript trace on one image is wrong for any other batch size: the
case of the TorchScript one-image warning (``aisafety/loading.py``), shared by the tests
that check the warning comes back from a Ray worker."""

from __future__ import annotations

import torch


class BatchAsConstant(torch.nn.Module):
    """Traced on one image, its batch size becomes the constant 1 (``int(x.shape[0])``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.reshape(int(x.shape[0]), -1))
