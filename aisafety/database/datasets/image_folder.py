"""Image files sorted into one folder per class (the torchvision ``ImageFolder`` layout).

::

    root/[train|test/]<class_name>/<image>.png|.jpg|.jpeg|.bmp

Class indices follow the sorted class folder names, as in torchvision, so a model trained
with ``torchvision.datasets.ImageFolder`` sees the same labels here. Without
``train/`` or ``test/`` subfolders the whole folder serves every split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.errors import ConfigError

EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp"})
_SPLITS = ("train", "test")
_GRAY_MODES = frozenset({"1", "L", "LA"})
_GRAY16_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def _visible_dirs(folder: Path) -> list[Path]:
    """Hidden folders (``.ipynb_checkpoints``, ``.git``) are tool clutter, never classes."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _split_root(root: Path, split: str) -> tuple[Path, list[str]]:
    """The folder to read and the class names, shared by all splits so labels agree."""
    present = [root / s for s in dict.fromkeys((*_SPLITS, split)) if (root / s).is_dir()]
    if not present:
        return root, [d.name for d in _visible_dirs(root)]
    folder = root / split
    if not folder.is_dir():
        raise ConfigError(
            f"dataset 'imagefolder': {root} has {', '.join(p.name for p in present)}/ but no "
            f"{split}/ subfolder; add {folder} or choose split "
            f"{' or '.join(repr(p.name) for p in present)}"
        )
    # A class missing from one split must not shift the indices of the others.
    names = sorted({d.name for p in present for d in _visible_dirs(p)})
    return folder, names


def read_image(file: Path) -> np.ndarray:
    """One image -> (H, W, 1) or (H, W, 3) uint8; grayscale stays 1-channel."""
    try:
        with Image.open(file) as image:
            image.load()
            if image.mode in _GRAY16_MODES:
                # 16-bit grayscale PNG: rescale 0..65535 to 0..255 rather than clip.
                wide = np.asarray(image, dtype=np.uint32)
                return ((wide * 255 + 32767) // 65535).astype(np.uint8)[..., None]
            if image.mode in _GRAY_MODES:
                return np.asarray(image.convert("L"))[..., None]
            # Palette, RGBA, CMYK, YCbCr ... all become plain RGB (alpha is dropped).
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ConfigError(f"dataset 'imagefolder': cannot read image {file} ({exc})") from exc


class ImageFolderDataset(DatasetSource):
    name = "imagefolder"
    description = "image files in root/[train|test/]<class>/ folders (torchvision ImageFolder)"

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        root = self.require_path(path)
        if not root.is_dir():
            raise ConfigError(
                f"dataset 'imagefolder': {root} is not a folder; point 'path' at the folder "
                f"holding one subfolder per class"
            )
        folder, classes = _split_root(root, split)
        if not classes:
            raise ConfigError(
                f"dataset 'imagefolder': no class subfolders in {folder}; put the images in "
                f"{folder}/<class_name>/"
            )
        files: list[Path] = []
        labels: list[int] = []
        for index, name in enumerate(classes):
            class_dir = folder / name
            if not class_dir.is_dir():
                continue
            found = sorted(
                p
                for p in class_dir.iterdir()
                if p.suffix.lower() in EXTENSIONS and p.is_file() and not p.name.startswith(".")
            )
            files += found
            labels += [index] * len(found)
        if not files:
            raise ConfigError(
                f"dataset 'imagefolder': no {'/'.join(sorted(EXTENSIONS))} images in the class "
                f"folders of {folder}"
            )
        x = images_to_tensor(self._stack(files), "NHWC")
        y = torch.as_tensor(labels, dtype=torch.int64)
        return LoadedDataset(self.name, x, y, tuple(classes))

    @staticmethod
    def _stack(files: list[Path]) -> np.ndarray:
        """Read every file into one (N, H, W, C) uint8 array; sizes must all agree."""
        first = read_image(files[0])
        images = [first]
        for file in files[1:]:
            image = read_image(file)
            if image.shape[:2] != first.shape[:2]:
                raise ConfigError(
                    f"dataset 'imagefolder': {file} is {image.shape[1]}x{image.shape[0]} but "
                    f"{files[0]} is {first.shape[1]}x{first.shape[0]}; resize all images "
                    'to one size (ImageNet\'s validation images: docs/own-model.md, "Data", '
                    "crops them to 224x224 into an npz file as torchvision's evaluation "
                    "transform does)"
                )
            images.append(image)
        if len({image.shape[2] for image in images}) > 1:
            # A few grayscale files among colour ones (common in photo sets): widen them.
            images = [np.repeat(im, 3, axis=2) if im.shape[2] == 1 else im for im in images]
        return np.stack(images)
