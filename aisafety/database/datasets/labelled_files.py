"""Images whose class index is in their file name: ``<anything>_<label>.jpg``.

The form of the ImageNet samples foolbox ships (``imagenet_<i>_<label>.jpg``, JPEG, 512x512
but for ``imagenet_10_541.jpg``, 1024x683; the label an ImageNet-1k index;
``../shared/data/imagenet-samples-foolbox/``): 20 images, for running an ImageNet-shaped
pipeline end to end, not for accuracy figures. Every image is resized to ``SIDE`` x ``SIDE``
with PIL's default resampling, as foolbox's ``utils.samples`` does (the 1024x683 one is
squeezed, not cropped); classes are the indices 0..999.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from aisafety.database.datasets.base import DatasetSource, LoadedDataset, images_to_tensor
from aisafety.database.datasets.image_folder import EXTENSIONS, read_image
from aisafety.errors import ConfigError

SIDE = 224  # the input size of ImageNet classifiers
CLASSES = 1000  # ImageNet-1k


def label_of(file: Path) -> int:
    """The integer after the last underscore of the file's stem."""
    tail = file.stem.rsplit("_", 1)[-1]
    if not tail.isdigit() or int(tail) >= CLASSES:
        raise ConfigError(
            f"dataset 'imagenet-samples': {file.name} does not end in _<class index 0-999>; "
            "name the files <anything>_<label>.jpg"
        )
    return int(tail)


class LabelledFilesDataset(DatasetSource):
    name = "imagenet-samples"
    description = (
        "<anything>_<ImageNet class>.jpg files in one folder, resized to 224x224 "
        "(foolbox's ImageNet samples)"
    )

    def load(self, path: Path | None, split: str) -> LoadedDataset:
        folder = self.require_path(path)
        files = sorted(
            p for p in folder.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file()
        ) if folder.is_dir() else []  # fmt: skip
        if not files:
            raise ConfigError(
                f"dataset 'imagenet-samples': no {'/'.join(sorted(EXTENSIONS))} images in "
                f"{folder}; point 'path' at the folder holding them"
            )
        images = np.stack([_resized(file) for file in files])
        labels = torch.as_tensor([label_of(file) for file in files], dtype=torch.int64)
        classes = tuple(str(i) for i in range(CLASSES))
        return LoadedDataset(self.name, images_to_tensor(images, "NHWC"), labels, classes)


def _resized(file: Path) -> np.ndarray:
    """(SIDE, SIDE, 3) uint8; a grey image as three equal channels."""
    image = read_image(file)
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return np.asarray(Image.fromarray(image).resize((SIDE, SIDE)))
