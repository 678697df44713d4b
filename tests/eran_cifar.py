"""The 100 CIFAR-10 test images of ERAN's subset (../shared/data/eran_test_subsets), as an
npz the ``npz`` dataset reads. At merge this may give way to the ``cifar10-embedded`` set."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.shared_data import shared_folder


def eran_cifar10(limit: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, 3, 32, 32) and labels; each CSV row is the label then HWC pixels."""
    csv = shared_folder("eran_test_subsets") / "cifar10_test.csv"
    rows = np.loadtxt(csv, delimiter=",", dtype=np.int64, max_rows=limit)
    images = rows[:, 1:].reshape(-1, 32, 32, 3).transpose(0, 3, 1, 2).astype(np.uint8)
    return np.ascontiguousarray(images), rows[:, 0]


def write_npz(path: Path, limit: int = 100) -> Path:
    images, labels = eran_cifar10(limit)
    np.savez(path, x=images, y=labels)
    return path
