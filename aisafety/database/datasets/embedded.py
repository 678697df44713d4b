"""The MNIST subsets shipped inside the package: the default needs no download.

``mnist_test_balanced_1000.npz``: the first 100 images of each class of the MNIST test set.
``mnist_train_balanced_5000.npz``: the first 500 images of each class of the MNIST training
set (in training-set order; ``source_index`` holds their indices in ``train-images-idx3``). It
is the profile data for neuron coverage (neuron bounds come from *training* activations,
DeepGauge), so coverage metrics work on the embedded default without the full dataset. Made
with ``idx = sort(concat(flatnonzero(y == c)[:500] for c in 0..9))`` over the raw IDX files.
"""

from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.errors import ConfigError

EMBEDDED_FILES = {
    "test": "mnist_test_balanced_1000.npz",
    "train": "mnist_train_balanced_5000.npz",
}
EMBEDDED_FILE = EMBEDDED_FILES["test"]


class EmbeddedMnist(DatasetSource):
    name = "mnist-embedded"
    description = (
        "MNIST subsets shipped in the package: 'test' 1,000 images (first 100 per class), "
        "'train' 5,000 images (first 500 per class)"
    )
    needs_path = False

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        if split not in EMBEDDED_FILES:
            raise ConfigError(
                f"the embedded MNIST subset has no split {split!r}; use one of "
                f"{sorted(EMBEDDED_FILES)}"
            )
        data = (resources.files("aisafety.data") / EMBEDDED_FILES[split]).read_bytes()
        with np.load(io.BytesIO(data)) as arrays:
            x = images_to_tensor(arrays["x"], "NHW")
            y = torch.from_numpy(arrays["y"].astype(np.int64))
        return LoadedDataset(self.name, x, y, tuple(str(i) for i in range(10)))
