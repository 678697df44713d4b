"""The MNIST test subset shipped inside the package: the default needs no download."""

from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.errors import ConfigError

EMBEDDED_FILE = "mnist_test_balanced_1000.npz"


class EmbeddedMnist(DatasetSource):
    name = "mnist-embedded"
    description = (
        "1,000 MNIST test images, 100 per class, shipped in the package "
        "(first 100 of each class in test-set order)"
    )
    needs_path = False

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        if split != "test":
            raise ConfigError("the embedded MNIST subset has only the 'test' split")
        data = (resources.files("aisafety.data") / EMBEDDED_FILE).read_bytes()
        with np.load(io.BytesIO(data)) as arrays:
            x = images_to_tensor(arrays["x"], "NHW")
            y = torch.from_numpy(arrays["y"].astype(np.int64))
        return LoadedDataset(self.name, x, y, tuple(str(i) for i in range(10)))
