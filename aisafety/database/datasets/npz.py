"""Any image set saved with ``numpy.savez``: the escape hatch for formats without a loader.

The file holds

* ``x``: images as (N, H, W), (N, H, W, C) or (N, C, H, W), either uint8 0..255 or float in
  [0, 1]. A 4-D array is read as NHWC when its last dimension is 1 or 3 and its second is
  not; otherwise as NCHW. So (N, 28, 28, 1) and (N, 32, 32, 3) are channels-last, while
  (N, 1, 28, 28), (N, 3, 32, 32) and the ambiguous (N, 3, 3, 3) are channels-first.
* ``y``: (N,) integer labels 0..K-1.
* ``classes`` (optional): K class names as a string array; default "0".."K-1".

``path`` is the ``.npz`` file, or a folder holding ``train.npz`` / ``test.npz``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.errors import ConfigError
from aisafety.files import regular_file

_CHANNELS = (1, 3)


def image_layout(shape: tuple[int, ...]) -> str:
    """Guess the layout of an image array from its shape (see the module docstring)."""
    if len(shape) == 3:
        return "NHW"
    if len(shape) == 4:
        return "NHWC" if shape[3] in _CHANNELS and shape[1] not in _CHANNELS else "NCHW"
    raise ValueError(f"images need 3 or 4 dimensions, got shape {shape}")


def _resolve(path: Path, split: str) -> Path:
    if not path.is_dir():
        return regular_file(path, "dataset 'npz': file")  # a FIFO would block np.load
    file = path / f"{split}.npz"
    if not file.is_file():
        raise ConfigError(
            f"dataset 'npz': {path} is a folder without {file.name}; add it or point 'path' "
            f"at the .npz file itself"
        )
    return regular_file(file, "dataset 'npz': file")


def read_npz(file: Path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None]:
    """Load and check ``x``, ``y`` and the optional ``classes`` without unpickling anything."""
    try:
        archive = np.load(file, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        # ValueError also covers pickled content, which allow_pickle=False refuses to run.
        raise ConfigError(
            f"{file} is not a readable .npz ({exc}); save it with np.savez(file, x=..., y=...)"
        ) from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ConfigError(f"{file} is a single .npy array; save x and y with np.savez")
    with archive:
        missing = [key for key in ("x", "y") if key not in archive.files]
        if missing:
            raise ConfigError(
                f"{file} lacks array(s) {', '.join(missing)} (has {', '.join(archive.files)}); "
                f"save with np.savez(file, x=images, y=labels)"
            )
        try:
            x, y = archive["x"], archive["y"]
            names = archive["classes"] if "classes" in archive.files else None
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ConfigError(
                f"{file}: cannot read its arrays ({exc}); store x and y as numeric arrays "
                f"and classes as a str array, not Python objects"
            ) from exc
    if x.ndim not in (3, 4):
        raise ConfigError(f"{file}: 'x' has shape {x.shape}; expected (N,H,W), NHWC or NCHW")
    if x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.floating):
        raise ConfigError(f"{file}: 'x' is {x.dtype}; store uint8 0..255 or float in [0, 1]")
    if np.issubdtype(x.dtype, np.floating) and x.size:
        if not np.isfinite(x).all():
            raise ConfigError(f"{file}: 'x' contains NaN or infinite values")
        if x.min() < 0 or x.max() > 1:
            raise ConfigError(
                f"{file}: float 'x' must lie in [0, 1], found {x.min()}..{x.max()}; "
                f"divide by 255 or store uint8"
            )
    y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(
            f"{file}: 'y' is {y.dtype} {y.shape}; expected {x.shape[0]} integer labels"
        )
    if y.size and y.min() < 0:
        raise ConfigError(f"{file}: 'y' has negative label {y.min()}")
    classes = None
    if names is not None:
        if names.ndim != 1 or names.dtype.kind not in "US":
            raise ConfigError(f"{file}: 'classes' must be a 1-D string array, got {names.dtype}")
        classes = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names.tolist())
        if y.size and y.max() >= len(classes):
            raise ConfigError(
                f"{file}: label {y.max()} has no name among the {len(classes)} 'classes'"
            )
    return x, y.astype(np.int64), classes


class NpzDataset(DatasetSource):
    name = "npz"
    description = "images x and labels y saved with numpy.savez (uint8 or [0, 1] floats)"

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        file = _resolve(self.require_path(path), split)
        x, y, classes = read_npz(file)
        named = classes is not None
        if classes is None:
            classes = tuple(str(i) for i in range(int(y.max()) + 1 if y.size else 0))
        tensor = images_to_tensor(x, image_layout(x.shape))
        return LoadedDataset(self.name, tensor, torch.from_numpy(y), classes, classes_named=named)
