"""Dataset loaders: synthetic files in each real on-disk format must round-trip exactly."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from aisafety.database.datasets.base import LoadedDataset, uniform_indices
from aisafety.database.datasets.cifar10 import Cifar10Dataset
from aisafety.database.datasets.idx import FashionMnistDataset, MnistDataset
from aisafety.database.datasets.image_folder import ImageFolderDataset
from aisafety.database.datasets.npz import NpzDataset, image_layout
from aisafety.database.datasets.svhn import SvhnDataset
from aisafety.errors import ConfigError
from tests.shared_data import shared_folder


def _check_tensors(data: LoadedDataset) -> None:
    assert data.x.dtype == torch.float32 and data.y.dtype == torch.int64
    assert data.x.dim() == 4 and len(data) == data.x.shape[0]
    assert float(data.x.min()) >= 0.0 and float(data.x.max()) <= 1.0


# --- CIFAR-10 --------------------------------------------------------------------------------


def _write_cifar(root: Path, sizes: dict[str, int], protocol: int = 2) -> dict[str, dict]:
    """Write batches in the official layout: dict with bytes keys, (N, 3072) uint8 rows."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    batches = {}
    for name, n in sizes.items():
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        batches[name] = batch
    return batches


CIFAR_TRAIN = {f"data_batch_{i}": i for i in range(1, 6)}


def test_cifar10_test_split_pixels_in_chw_row_order(tmp_path: Path) -> None:
    batches = _write_cifar(tmp_path, {"test_batch": 4})
    raw = batches["test_batch"][b"data"]
    raw[2, 1 * 1024 + 5 * 32 + 7] = 200  # image 2, green channel, row 5, column 7
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(
        pickle.dumps(batches["test_batch"], protocol=2)
    )
    for path in (tmp_path, tmp_path / "cifar-10-batches-py"):  # parent or the folder itself
        data = Cifar10Dataset().load(path, "test")
        _check_tensors(data)
        assert data.x.shape == (4, 3, 32, 32)
        assert data.x[2, 1, 5, 7].item() == pytest.approx(200 / 255)
        assert torch.equal(
            data.x.mul(255).round().to(torch.uint8).reshape(4, -1), torch.from_numpy(raw)
        )
        assert data.y.tolist() == batches["test_batch"][b"labels"]
        assert data.classes[0] == "airplane" and data.classes[9] == "truck"


def test_cifar10_train_concatenates_five_batches_in_order(tmp_path: Path) -> None:
    batches = _write_cifar(tmp_path, {**CIFAR_TRAIN, "test_batch": 1}, protocol=4)
    data = Cifar10Dataset().load(tmp_path, "train")
    assert len(data) == 1 + 2 + 3 + 4 + 5
    expected = sum((batches[name][b"labels"] for name in CIFAR_TRAIN), [])
    assert data.y.tolist() == expected
    last = batches["data_batch_5"][b"data"][-1]
    assert torch.equal(
        data.x[-1].mul(255).round().to(torch.uint8).flatten(), torch.from_numpy(last)
    )


def test_cifar10_reads_python2_era_numpy_globals(tmp_path: Path) -> None:
    """The official files name numpy.core.multiarray, which numpy 2 renamed to numpy._core."""
    batches = _write_cifar(tmp_path, {"test_batch": 2})
    file = tmp_path / "cifar-10-batches-py" / "test_batch"
    file.write_bytes(file.read_bytes().replace(b"numpy._core.", b"numpy.core."))
    data = Cifar10Dataset().load(tmp_path, "test")
    assert data.y.tolist() == batches["test_batch"][b"labels"]


def test_cifar10_refuses_foreign_pickle_globals(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Path("x")}, protocol=2))
    with pytest.raises(ConfigError, match="test_batch"):
        Cifar10Dataset().load(tmp_path, "test")


def test_cifar10_missing_batch_names_file_and_folder(tmp_path: Path) -> None:
    _write_cifar(tmp_path, {"data_batch_1": 1, "data_batch_2": 1})
    with pytest.raises(ConfigError, match=r"data_batch_3.*cifar-10-batches-py"):
        Cifar10Dataset().load(tmp_path, "train")
    with pytest.raises(ConfigError, match="does not exist"):
        Cifar10Dataset().load(tmp_path / "nowhere", "test")
    with pytest.raises(ConfigError, match="split 'val'"):
        Cifar10Dataset().load(tmp_path, "val")


def test_a_missing_path_names_the_files_and_the_shipped_subset() -> None:
    """`dataset: {name: cifar10}` without a path said only "the folder holding its files":
    a user without CIFAR-10 on disk is told what files, and which subset ships instead."""
    with pytest.raises(ConfigError, match=r"python pickle batches .*nothing is downloaded\); "
                       r"without them, evaluate dataset: \{name: cifar10-embedded\}"):  # fmt: skip
        Cifar10Dataset().load(None, "test")
    with pytest.raises(ConfigError, match=r"IDX files .*\{name: mnist-embedded\}"):
        MnistDataset().load(None, "test")


def test_cifar10_malformed_data_shape(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batch = {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}
    (folder / "test_batch").write_bytes(pickle.dumps(batch))
    with pytest.raises(ConfigError, match=r"test_batch.*3072"):
        Cifar10Dataset().load(tmp_path, "test")


# --- SVHN ------------------------------------------------------------------------------------


def test_svhn_layout_and_label_ten_is_zero(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (32, 32, 3, 3), dtype=np.uint8)
    x[4, 9, 2, 1] = 77  # row 4, column 9, blue, image 1
    y = np.array([[10], [1], [5]], dtype=np.uint8)
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": x, "y": y})
    data = SvhnDataset().load(tmp_path, "test")
    _check_tensors(data)
    assert data.x.shape == (3, 3, 32, 32)
    assert data.x[1, 2, 4, 9].item() == pytest.approx(77 / 255)
    expected = torch.from_numpy(x.transpose(3, 2, 0, 1).copy()).float() / 255
    assert torch.equal(data.x, expected)
    assert data.y.tolist() == [0, 1, 5]


def test_svhn_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train_32x32.mat"):
        SvhnDataset().load(tmp_path, "train")
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": np.zeros((32, 32, 3, 2), np.uint8)})
    with pytest.raises(ConfigError, match=r"test_32x32.mat.*'y'"):
        SvhnDataset().load(tmp_path, "test")
    (tmp_path / "train_32x32.mat").write_bytes(b"not a mat file")
    with pytest.raises(ConfigError, match="train_32x32.mat"):
        SvhnDataset().load(tmp_path, "train")


# --- ImageFolder -----------------------------------------------------------------------------


def _save(path: Path, array: np.ndarray, mode: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode).save(path)


def test_image_folder_two_rgb_classes(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    dog = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    cats = [rng.integers(0, 256, (4, 5, 3), dtype=np.uint8) for _ in range(2)]
    _save(tmp_path / "dog" / "a.png", dog)  # created first, still sorts after "cat"
    _save(tmp_path / "cat" / "b.bmp", cats[1])
    _save(tmp_path / "cat" / "a.PNG", cats[0])
    (tmp_path / "cat" / "notes.txt").write_text("ignored")
    data = ImageFolderDataset().load(tmp_path, "test")
    _check_tensors(data)
    assert data.classes == ("cat", "dog")
    assert data.y.tolist() == [0, 0, 1]
    assert data.x.shape == (3, 3, 4, 5)
    expected = np.stack([*cats, dog]).transpose(0, 3, 1, 2)
    assert torch.equal(data.x, torch.from_numpy(expected).float() / 255)


def test_image_folder_grayscale_stays_one_channel(tmp_path: Path) -> None:
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    _save(tmp_path / "a" / "0.png", gray)
    _save(tmp_path / "b" / "0.png", gray[::-1].copy())
    data = ImageFolderDataset().load(tmp_path, "train")
    assert data.x.shape == (2, 1, 3, 4)
    assert data.x[0, 0, 2, 3].item() == pytest.approx(220 / 255)


def test_image_folder_palette_and_rgba_become_rgb(tmp_path: Path) -> None:
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[0, 1] = (255, 0, 0)
    rgb[1, 0] = (0, 128, 255)
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=4).save(
        _mkdir(tmp_path / "p") / "0.png"
    )
    rgba = np.dstack([rgb, np.full((2, 2), 9, np.uint8)])
    _save(tmp_path / "q" / "0.png", rgba, "RGBA")
    data = ImageFolderDataset().load(tmp_path, "test")
    assert data.x.shape == (2, 3, 2, 2)
    expected = torch.from_numpy(rgb.transpose(2, 0, 1).copy()).float() / 255
    assert torch.equal(data.x[0], expected) and torch.equal(data.x[1], expected)


def test_image_folder_gray_among_colour_is_widened(tmp_path: Path) -> None:
    _save(tmp_path / "a" / "0.png", np.full((2, 2, 3), 7, np.uint8))
    _save(tmp_path / "b" / "0.png", np.full((2, 2), 50, np.uint8))
    data = ImageFolderDataset().load(tmp_path, "test")
    assert data.x.shape == (2, 3, 2, 2)
    assert torch.allclose(data.x[1], torch.full((3, 2, 2), 50 / 255))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_image_folder_splits_share_class_indices(tmp_path: Path) -> None:
    pixel = np.zeros((2, 2, 3), np.uint8)
    for name in ("ant", "bee", "cow"):
        _save(tmp_path / "train" / name / "0.png", pixel)
    _save(tmp_path / "test" / "cow" / "0.png", pixel + 1)  # test lacks ant and bee
    data = ImageFolderDataset().load(tmp_path, "test")
    assert data.classes == ("ant", "bee", "cow")
    assert data.y.tolist() == [2]
    assert len(ImageFolderDataset().load(tmp_path, "train")) == 3


def test_image_folder_errors(tmp_path: Path) -> None:
    _save(tmp_path / "a" / "0.png", np.zeros((4, 4, 3), np.uint8))
    _save(tmp_path / "b" / "odd.png", np.zeros((4, 5, 3), np.uint8))
    # ImageNet's validation images differ in size: the error names the recipe that crops
    # them (session 21; it said only "resize all images to one size")
    with pytest.raises(ConfigError, match=r"odd\.png is 5x4.*docs/own-model\.md, \"Data\""):
        ImageFolderDataset().load(tmp_path, "test")
    (tmp_path / "b" / "odd.png").write_bytes(b"broken")
    with pytest.raises(ConfigError, match=r"cannot read image .*odd\.png"):
        ImageFolderDataset().load(tmp_path, "test")
    empty = _mkdir(tmp_path / "empty")
    with pytest.raises(ConfigError, match="no class subfolders"):
        ImageFolderDataset().load(empty, "test")
    _mkdir(tmp_path / "split" / "train" / "a")
    with pytest.raises(ConfigError, match=r"no test/ subfolder"):
        ImageFolderDataset().load(tmp_path / "split", "test")
    with pytest.raises(ConfigError, match="does not exist"):
        ImageFolderDataset().load(tmp_path / "missing", "test")


# --- NPZ -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "layout"),
    [
        ((5, 28, 28), "NHW"),
        ((5, 28, 28, 1), "NHWC"),
        ((5, 32, 32, 3), "NHWC"),
        ((5, 1, 28, 28), "NCHW"),
        ((5, 3, 32, 32), "NCHW"),
        ((5, 3, 3, 3), "NCHW"),
    ],
)
def test_npz_layout_rule(shape: tuple[int, ...], layout: str) -> None:
    assert image_layout(shape) == layout


def test_npz_nhwc_uint8_with_classes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (4, 6, 7, 3), dtype=np.uint8)
    y = np.array([1, 0, 2, 1])
    np.savez(tmp_path / "set.npz", x=x, y=y, classes=np.array(["no", "maybe", "yes"]))
    data = NpzDataset().load(tmp_path / "set.npz", "test")
    _check_tensors(data)
    assert data.x.shape == (4, 3, 6, 7)
    assert torch.equal(data.x, torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255)
    assert data.y.tolist() == [1, 0, 2, 1]
    assert data.classes == ("no", "maybe", "yes")


def test_npz_float_nchw_and_nhw(tmp_path: Path) -> None:
    x = np.linspace(0, 1, 2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3)
    np.savez(tmp_path / "nchw.npz", x=x, y=np.array([0, 4], np.uint8))
    data = NpzDataset().load(tmp_path / "nchw.npz", "test")
    assert torch.equal(data.x, torch.from_numpy(x))
    assert data.classes == ("0", "1", "2", "3", "4")
    np.savez(tmp_path / "nhw.npz", x=x[:, 0], y=np.array([0, 1]))
    assert NpzDataset().load(tmp_path / "nhw.npz", "test").x.shape == (2, 1, 3, 3)


def test_npz_folder_picks_split_file(tmp_path: Path) -> None:
    for split, n in (("train", 3), ("test", 2)):
        np.savez(tmp_path / f"{split}.npz", x=np.zeros((n, 2, 2), np.uint8), y=np.arange(n))
    assert len(NpzDataset().load(tmp_path, "train")) == 3
    assert len(NpzDataset().load(tmp_path, "test")) == 2


def test_npz_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="absent.npz"):
        NpzDataset().load(tmp_path / "absent.npz", "test")
    with pytest.raises(ConfigError, match=r"without test\.npz"):
        NpzDataset().load(tmp_path, "test")
    np.savez(tmp_path / "no_y.npz", x=np.zeros((2, 2, 2), np.uint8))
    with pytest.raises(ConfigError, match=r"no_y\.npz lacks array\(s\) y"):
        NpzDataset().load(tmp_path / "no_y.npz", "test")
    np.savez(tmp_path / "big.npz", x=np.full((1, 2, 2), 3.0), y=np.array([0]))
    with pytest.raises(ConfigError, match=r"big\.npz.*\[0, 1\]"):
        NpzDataset().load(tmp_path / "big.npz", "test")
    np.savez(
        tmp_path / "names.npz",
        x=np.zeros((1, 2, 2), np.uint8),
        y=np.array([2]),
        classes=np.array(["a", "b"]),
    )
    with pytest.raises(ConfigError, match="label 2 has no name"):
        NpzDataset().load(tmp_path / "names.npz", "test")
    np.savez(
        tmp_path / "objects.npz",
        x=np.zeros((1, 2, 2), np.uint8),
        y=np.array([0]),
        classes=np.array(["a", None], dtype=object),
    )
    with pytest.raises(ConfigError, match=r"objects\.npz"):
        NpzDataset().load(tmp_path / "objects.npz", "test")
    np.savez(tmp_path / "ints.npz", x=np.zeros((1, 2, 2), np.int64), y=np.array([0]))
    with pytest.raises(ConfigError, match="store uint8"):
        NpzDataset().load(tmp_path / "ints.npz", "test")


# --- Real IDX files --------------------------------------------------------------------------


def test_mnist_idx_test_split() -> None:
    data = MnistDataset().load(shared_folder("mnist"), "test")
    _check_tensors(data)
    assert data.x.shape == (10000, 1, 28, 28)
    assert data.y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert data.x.double().mean().item() == pytest.approx(33.791224 / 255, abs=1e-6)


def test_fashion_mnist_idx_test_split_is_balanced() -> None:
    data = FashionMnistDataset().load(shared_folder("fashion-mnist"), "test")
    _check_tensors(data)
    assert torch.bincount(data.y, minlength=10).tolist() == [1000] * 10
    assert data.classes[9] == "Ankle boot"


# --- balanced_subset -------------------------------------------------------------------------


def _imbalanced() -> LoadedDataset:
    y = torch.tensor([0] * 20 + [1] * 5 + [2] * 8)
    x = torch.arange(len(y), dtype=torch.float32).reshape(-1, 1, 1, 1) / len(y)
    return LoadedDataset("toy", x, y, ("a", "b", "c"))


def test_balanced_subset_equal_counts_and_deterministic() -> None:
    data = _imbalanced()
    subset = data.balanced_subset(9, seed=5)
    assert torch.bincount(subset.y).tolist() == [3, 3, 3]
    again = data.balanced_subset(9, seed=5)
    assert torch.equal(subset.x, again.x) and torch.equal(subset.y, again.y)
    others = [data.balanced_subset(9, seed=s).x for s in range(6, 10)]
    assert any(not torch.equal(subset.x, other) for other in others)


def test_balanced_subset_runs_out_of_a_small_class() -> None:
    data = _imbalanced()
    subset = data.balanced_subset(20, seed=0)
    assert torch.bincount(subset.y).tolist() == [8, 5, 7]  # 'b' has only 5
    assert data.balanced_subset(None) is data
    assert data.balanced_subset(len(data)) is data


# --- uniform_subset --------------------------------------------------------------------------


def test_uniform_subset_is_numpys_seeded_draw_in_split_order() -> None:
    data = _imbalanced()
    subset = data.uniform_subset(9, seed=5)
    # the reference: numpy's generator drawn directly, independent of the platform's code
    expected = sorted(np.random.default_rng(5).choice(len(data), 9, replace=False).tolist())
    assert uniform_indices(len(data), 9, 5) == expected
    assert torch.equal(subset.x, data.x[expected]) and torch.equal(subset.y, data.y[expected])
    assert data.uniform_subset(None) is data and data.uniform_subset(len(data)) is data


def test_uniform_subset_is_uniform_not_balanced() -> None:
    # every index equally likely: over 2,000 seeds each of the 33 is kept ~ 9/33 of the time
    # (balanced_subset would keep each of class 'b''s 5 every time)
    counts = torch.zeros(33)
    for seed in range(2000):
        counts[uniform_indices(33, 9, seed)] += 1
    share = counts / 2000
    assert share.sub(9 / 33).abs().max() < 0.05  # binomial sd ~ 0.01 per index


def test_dataset_spec_sampling_is_validated_and_drives_load_data() -> None:
    from pydantic import ValidationError

    from aisafety.interfaces import DatasetSpec
    from aisafety.loading import load_data
    from aisafety.plugins import default_registry

    with pytest.raises(ValidationError, match="balanced"):
        DatasetSpec(sampling="random")
    registry = default_registry()
    uniform = load_data(DatasetSpec(limit=50, seed=3, sampling="uniform"), registry)
    whole = load_data(DatasetSpec(), registry)
    index = uniform_indices(len(whole), 50, 3)
    assert torch.equal(uniform.x, whole.x[index]) and torch.equal(uniform.y, whole.y[index])
    balanced = load_data(DatasetSpec(limit=50, seed=3), registry)
    assert torch.bincount(balanced.y, minlength=10).tolist() == [5] * 10
    assert not torch.equal(balanced.x, uniform.x)


# --- the embedded CIFAR-10 subset ------------------------------------------------------------

# sha256 of the 100 images as uint8 HWC bytes, computed from ERAN's CSV when the file was made.
CIFAR10_EMBEDDED_SHA256 = "efd083b0ee394fcd75573b4768c330c582a6019ccba153f565591ea6e1aa5e12"


def _uint8_hwc(data: LoadedDataset) -> np.ndarray:
    return (data.x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def test_cifar10_embedded_shape_labels_and_checksum() -> None:
    from aisafety.database.datasets.embedded import EmbeddedCifar10

    data = EmbeddedCifar10().load(None, "test")
    _check_tensors(data)
    assert data.x.shape == (100, 3, 32, 32)
    assert data.y[:20].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1, 0, 9, 5, 7, 9, 8, 5, 7, 8, 6]
    assert np.bincount(data.y.numpy()).tolist() == [10, 6, 8, 10, 7, 8, 16, 11, 13, 11]
    assert data.classes[0] == "airplane" and data.classes[9] == "truck"
    pixels = _uint8_hwc(data)
    assert pixels[0, 0, :5, 0].tolist() == [158, 159, 165, 166, 160]  # test_batch data[0]
    assert hashlib.sha256(pixels.tobytes()).hexdigest() == CIFAR10_EMBEDDED_SHA256
    with pytest.raises(ConfigError, match="no split 'train'"):
        EmbeddedCifar10().load(None, "train")


def test_cifar10_embedded_equals_the_eran_csv() -> None:
    from aisafety.database.datasets.embedded import EmbeddedCifar10

    csv = shared_folder("eran_test_subsets") / "cifar10_test.csv"
    rows = np.loadtxt(csv, delimiter=",", dtype=np.int64)
    data = EmbeddedCifar10().load(None, "test")
    assert np.array_equal(_uint8_hwc(data), rows[:, 1:].reshape(-1, 32, 32, 3))
    assert np.array_equal(data.y.numpy(), rows[:, 0])
