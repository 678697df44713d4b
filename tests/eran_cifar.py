"""The 100 CIFAR-10 test images of ERAN's subset (../shared/data/eran_test_subsets), as an
npz the ``npz`` dataset reads. At merge this may give way to the ``cifar10-embedded`` set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

CSV = Path(__file__).resolve().parents[2] / "shared/data/eran_test_subsets/cifar10_test.csv"
if not CSV.is_file():  # a worktree sits beside main: /work/wt-x -> /work/shared
    CSV = Path("/work/shared/data/eran_test_subsets/cifar10_test.csv")


def eran_cifar10(limit: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, 3, 32, 32) and labels; each CSV row is the label then HWC pixels."""
    if not CSV.is_file():
        pytest.skip(f"the shared CIFAR-10 subset {CSV} is not here")
    rows = np.loadtxt(CSV, delimiter=",", dtype=np.int64, max_rows=limit)
    images = rows[:, 1:].reshape(-1, 32, 32, 3).transpose(0, 3, 1, 2).astype(np.uint8)
    return np.ascontiguousarray(images), rows[:, 0]


def write_npz(path: Path, limit: int = 100) -> Path:
    images, labels = eran_cifar10(limit)
    np.savez(path, x=images, y=labels)
    return path
