"""MNIST and Fashion-MNIST in their standard IDX files (optionally gzipped)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.errors import ConfigError

_PREFIX = {"train": "train", "test": "t10k"}
_MAGIC_IMAGES, _MAGIC_LABELS = 0x803, 0x801


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse one IDX file: big-endian magic, dimensions, then uint8 data."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError, zlib.error) as exc:  # junk or cut-off .gz
        raise ConfigError(
            f"{path} cannot be read ({exc}); download the file again (a .gz must be gzip data)"
        ) from None
    found = int.from_bytes(data[:4], "big")
    if len(data) < 4 or found != magic:
        raise ConfigError(f"{path} is not an IDX file of the expected kind (magic {found:#x})")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = 4 + 4 * ndim + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        raise ConfigError(
            f"{path} holds {len(data):,} bytes but its header {dims} needs {expected:,}; the "
            "file is truncated or damaged: download it again"
        )
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()


def _find(root: Path, stem: str) -> Path:
    """Accept both 't10k-images-idx3-ubyte' and torchvision's 't10k-images.idx3-ubyte'."""
    for folder in (root, root / "raw"):
        for name in (stem, stem.replace("-idx", ".idx")):
            for suffix in ("", ".gz"):
                candidate = folder / f"{name}{suffix}"
                if candidate.exists():
                    return candidate
    raise ConfigError(f"no {stem}[.gz] under {root}; point 'path' at the folder of the IDX files")


class IdxDataset(DatasetSource):
    classes: tuple[str, ...] = tuple(str(i) for i in range(10))

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        root = self.require_path(path)
        prefix = _PREFIX[split]
        images = read_idx(_find(root, f"{prefix}-images-idx3-ubyte"), _MAGIC_IMAGES)
        labels = read_idx(_find(root, f"{prefix}-labels-idx1-ubyte"), _MAGIC_LABELS)
        x = images_to_tensor(images, "NHW")
        return LoadedDataset(self.name, x, torch.from_numpy(labels.astype(np.int64)), self.classes)


class MnistDataset(IdxDataset):
    name = "mnist"
    description = "MNIST handwritten digits, IDX files (LeCun et al.)"
    shipped_subset = "{name: mnist-embedded} (1,000 of its test images, in the package)"


class FashionMnistDataset(IdxDataset):
    name = "fashion-mnist"
    description = "Fashion-MNIST clothing images, IDX files (Xiao et al., Zalando)"
    classes = (
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    )
