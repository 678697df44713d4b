"""SVHN cropped digits in their standard ``{train,test}_32x32.mat`` files (Netzer et al. 2011)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.errors import ConfigError

_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}


def read_mat(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One ``*_32x32.mat`` -> (N, 3, 32, 32) uint8 images and (N,) int64 digit labels."""
    import scipy.io  # here: only SVHN needs it, and every registry build imports this module

    try:
        mat = scipy.io.loadmat(file)
    except (scipy.io.matlab.MatReadError, ValueError, OSError, NotImplementedError) as exc:
        raise ConfigError(
            f"{file} is not a readable MATLAB file ({exc}); use the cropped-digits file "
            f"from the SVHN site unchanged"
        ) from exc
    if "X" not in mat or "y" not in mat:
        raise ConfigError(f"{file} lacks the 'X' and 'y' variables of the SVHN cropped digits")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise ConfigError(f"{file}: 'X' is {x.dtype} {x.shape}, expected uint8 (32, 32, 3, N)")
    if y.shape != (x.shape[3],):
        raise ConfigError(f"{file}: 'y' holds {y.size} labels for {x.shape[3]} images")
    # MATLAB re-saves may store labels as double; accept them while they are whole numbers.
    if not np.issubdtype(y.dtype, np.number) or np.any(y != np.round(y)):
        raise ConfigError(f"{file}: 'y' must hold whole-number labels, found {y.dtype}")
    if y.size and (y.min() < 0 or y.max() > 10):
        raise ConfigError(f"{file}: labels outside 0..10 ({y.min()}..{y.max()})")
    labels = y.astype(np.int64)
    labels[labels == 10] = 0  # SVHN writes digit 0 as class 10 (MATLAB 1-based habit)
    return x.transpose(3, 2, 0, 1), labels  # (H, W, C, N) -> (N, C, H, W)


class SvhnDataset(DatasetSource):
    name = "svhn"
    description = "SVHN street-view house-number digits, 32x32 cropped .mat files"
    classes: tuple[str, ...] = tuple(str(i) for i in range(10))

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        if split not in _FILES:
            raise ConfigError(f"dataset 'svhn': split {split!r} unknown; use 'train' or 'test'")
        root = self.require_path(path)
        file = root / _FILES[split]
        if not file.is_file():
            raise ConfigError(
                f"dataset 'svhn': {file} not found; point 'path' at the folder holding "
                f"{_FILES[split]} (format 2, cropped digits, from ufldl.stanford.edu/housenumbers)"
            )
        images, labels = read_mat(file)
        x = images_to_tensor(images, "NCHW")
        return LoadedDataset(self.name, x, torch.from_numpy(labels), self.classes)
