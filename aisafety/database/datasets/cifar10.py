"""CIFAR-10 in its standard python pickle layout (``cifar-10-batches-py``, Krizhevsky 2009)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.errors import ConfigError

_FOLDER = "cifar-10-batches-py"
_BATCHES = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}
_SIDE, _CHANNELS = 32, 3

# What the batch files legitimately reference: numpy array/dtype reconstruction (as pickled
# by Python 2 numpy, numpy 1.x and numpy 2.x) and the codec Python 3 uses for bytes.
_ALLOWED_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }
)


class _BatchUnpickler(pickle.Unpickler):
    """Unpickling runs arbitrary code, so only the globals a CIFAR batch needs may resolve."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return super().find_class(module, name)


def _batch_root(path: Path) -> Path:
    """Accept the ``cifar-10-batches-py`` folder itself or the folder that contains it."""
    nested = path / _FOLDER
    return nested if nested.is_dir() else path


def read_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> (N, 3, 32, 32) uint8 images and (N,) int64 labels."""
    try:
        with file.open("rb") as handle:
            batch = _BatchUnpickler(handle, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise ConfigError(
            f"{file} is not a CIFAR-10 python batch ({exc}); use the files of "
            f"cifar-10-python.tar.gz unchanged"
        ) from exc
    if not isinstance(batch, dict):
        raise ConfigError(f"{file} holds a {type(batch).__name__}, not a CIFAR-10 batch dict")
    # The official files have bytes keys; accept str keys from re-pickled copies too.
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise ConfigError(f"{file} lacks the 'data' and 'labels' entries of a CIFAR-10 batch")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"])
    row = _CHANNELS * _SIDE * _SIDE
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != row:
        raise ConfigError(
            f"{file}: 'data' is {data.dtype} {data.shape}, expected uint8 (N, {row}) rows "
            f"of 1024 red, 1024 green, 1024 blue values"
        )
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(
            f"{file}: 'labels' has shape {labels.shape}, expected {data.shape[0]} integers"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= len(Cifar10Dataset.classes)):
        raise ConfigError(f"{file}: labels outside 0..9 ({labels.min()}..{labels.max()})")
    # Each row is channel-major, then row-major: exactly C, H, W order.
    images = data.reshape(-1, _CHANNELS, _SIDE, _SIDE)
    return images, labels.astype(np.int64)


class Cifar10Dataset(DatasetSource):
    name = "cifar10"
    description = "CIFAR-10 32x32 colour images, python pickle batches (Krizhevsky 2009)"
    shipped_subset = "{name: cifar10-embedded} (its first 100 test images, in the package)"
    classes: tuple[str, ...] = (
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    )

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        if split not in _BATCHES:
            raise ConfigError(f"dataset 'cifar10': split {split!r} unknown; use 'train' or 'test'")
        root = _batch_root(self.require_path(path))
        files = [root / name for name in _BATCHES[split]]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ConfigError(
                f"dataset 'cifar10': {', '.join(missing)} not found in {root}; point 'path' at "
                f"the extracted {_FOLDER} folder (or its parent) of cifar-10-python.tar.gz"
            )
        parts = [read_batch(f) for f in files]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        x = images_to_tensor(images, "NCHW")
        return LoadedDataset(self.name, x, torch.from_numpy(labels), self.classes)
