"""The image subsets shipped inside the package: the default needs no download.

``mnist_test_balanced_1000.npz``: the first 100 images of each class of the MNIST test set.
``mnist_train_balanced_5000.npz``: the first 500 images of each class of the MNIST training
set (in training-set order; ``source_index`` holds their indices in ``train-images-idx3``). It
is the profile data for neuron coverage (neuron bounds come from *training* activations,
DeepGauge), so coverage metrics work on the embedded default without the full dataset. Made
with ``idx = sort(concat(flatnonzero(y == c)[:500] for c in 0..9))`` over the raw IDX files.

``cifar10_test_100.npz``: the first 100 images of the CIFAR-10 test set (uint8 HWC, labels
0..9 and the ten class names), from ERAN's ``data/cifar10_test.csv`` (eth-sri/eran@8771d31,
Apache-2.0; checked pixel-exact against CIFAR-10's ``test_batch`` where a copy was reachable,
see ``../shared/data/README.md`` section 3). It lets a CIFAR-shaped model be evaluated with no
download; 100 images are a smoke test, not a benchmark (the class counts are uneven:
10, 6, 8, 10, 7, 8, 16, 11, 13, 11).
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
CIFAR10_EMBEDDED_FILE = "cifar10_test_100.npz"


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
        x, y, _ = _read(EMBEDDED_FILES[split], "NHW")
        return LoadedDataset(self.name, x, y, tuple(str(i) for i in range(10)))


class EmbeddedCifar10(DatasetSource):
    name = "cifar10-embedded"
    description = "CIFAR-10 subset shipped in the package: 'test' 100 images (the first 100)"
    needs_path = False

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        if split != "test":
            raise ConfigError(
                f"the embedded CIFAR-10 subset has no split {split!r}; it ships only 'test' "
                "(100 images); use the 'cifar10' dataset with 'path' for the training set"
            )
        x, y, classes = _read(CIFAR10_EMBEDDED_FILE, "NHWC")
        return LoadedDataset(self.name, x, y, classes)


def _read(file: str, layout: str) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """Images as [0, 1] NCHW floats, int64 labels and the class names (if stored)."""
    data = (resources.files("aisafety.data") / file).read_bytes()
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        x = images_to_tensor(arrays["x"], layout)
        y = torch.from_numpy(arrays["y"].astype(np.int64))
        names = tuple(str(n) for n in arrays["classes"]) if "classes" in arrays.files else ()
    return x, y, names
