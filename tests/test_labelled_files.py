"""The ``imagenet-samples`` dataset: foolbox's 20 ImageNet samples, labels from file names."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aisafety.database.datasets.labelled_files import LabelledFilesDataset
from aisafety.errors import ConfigError

FOLDER = Path(__file__).resolve().parents[1].parent / "shared/data/imagenet-samples-foolbox"


@pytest.mark.skipif(not FOLDER.is_dir(), reason="../shared/data is not beside the checkout")
def test_the_foolbox_samples_load_at_224_with_their_labels():
    data = LabelledFilesDataset().load(FOLDER, "test")
    assert tuple(data.x.shape) == (20, 3, 224, 224) and len(data.classes) == 1000
    # the labels of the data README's file list (imagenet_<i>_<label>.jpg)
    assert data.y[:5].tolist() == [243, 559, 438, 990, 949]
    first = FOLDER / "imagenet_00_243.jpg"
    sha = hashlib.sha256(first.read_bytes()).hexdigest()
    assert sha == "28b7b933c8028c6e20bf74a86a709eda42ce99f14c8742cb657cb386f08a4c9d"
    with Image.open(first) as image:  # foolbox's utils.samples: PIL's resize to 224x224
        expected = np.asarray(image.convert("RGB").resize((224, 224)), dtype=np.float32) / 255
    assert np.allclose(data.x[0].permute(1, 2, 0).numpy(), expected, atol=1e-6)


def test_grey_images_become_three_channels_and_bad_names_are_named(tmp_path):
    Image.fromarray(np.full((10, 12), 200, np.uint8)).save(tmp_path / "a_7.png")
    data = LabelledFilesDataset().load(tmp_path, "test")
    assert tuple(data.x.shape) == (1, 3, 224, 224) and data.y.tolist() == [7]
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "cat.png")
    with pytest.raises(ConfigError, match="cat.png does not end in _<class index 0-999>"):
        LabelledFilesDataset().load(tmp_path, "test")
    with pytest.raises(ConfigError, match="no .* images"):
        LabelledFilesDataset().load(tmp_path / "a_7.png", "test")
