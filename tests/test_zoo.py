"""The shipped zoo model: integrity checks, accuracy, and retraining from a recipe."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from aisafety.cli import main
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.datasets.idx import MnistDataset
from aisafety.database.zoo import builtin_zoo, list_models, load_zoo_model
from aisafety.errors import IntegrityError, UnknownNameError

SHARED_MNIST = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


def test_shipped_model_reaches_98_percent_on_full_mnist_test():
    if not SHARED_MNIST.is_dir():
        pytest.skip(f"full MNIST test set not found at {SHARED_MNIST}")
    predictor = load_zoo_model("mnist-cnn")
    test = MnistDataset().load(SHARED_MNIST, "test")
    with torch.inference_mode():
        predictions = torch.cat([predictor.predict(b) for b in test.x.split(2000)])
    accuracy = (predictions == test.y).float().mean().item()
    assert accuracy >= 0.98
    recorded = list_models()["mnist-cnn"][0].metrics["clean_accuracy"]
    assert accuracy == pytest.approx(recorded, abs=1e-4)


def test_embedded_subset_is_real_and_class_balanced():
    data = EmbeddedMnist().load(None, "test")
    assert data.x.shape == (1000, 1, 28, 28)
    assert torch.bincount(data.y).tolist() == [100] * 10
    if SHARED_MNIST.is_dir():  # the first 100 of each class of the real test set
        full = MnistDataset().load(SHARED_MNIST, "test")
        index = np.sort(np.concatenate([np.flatnonzero(full.y == c)[:100] for c in range(10)]))
        assert torch.equal(full.x[index], data.x) and torch.equal(full.y[index], data.y)


def test_tampered_checkpoint_is_refused(tmp_path, monkeypatch):
    zoo = tmp_path / "zoo"
    shutil.copytree(Path(str(builtin_zoo())), zoo)
    weights = zoo / "mnist-cnn.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the weights
    weights.write_bytes(bytes(data))
    monkeypatch.setenv("AISAFETY_ZOO_PATH", str(zoo))
    with pytest.raises(IntegrityError, match="sha256"):
        load_zoo_model("mnist-cnn")


def test_unknown_zoo_model_lists_known_ones():
    with pytest.raises(UnknownNameError, match="mnist-cnn"):
        load_zoo_model("resnet-9000")


def test_zoo_train_writes_checkpoint_and_manifest_that_load(tmp_path, monkeypatch):
    data = EmbeddedMnist().load(None, "test")
    x = (data.x[:, 0] * 255).round().to(torch.uint8).numpy()
    np.savez(tmp_path / "train.npz", x=x[::2], y=data.y[::2].numpy())
    np.savez(tmp_path / "test.npz", x=x[1::2], y=data.y[1::2].numpy())
    out = tmp_path / "zoo"
    code = main(
        [
            "zoo", "train", "--dataset", "npz", "--data-dir", str(tmp_path), "--name", "tiny",
            "--out", str(out), "--epochs", "2", "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())["tiny"]
    assert manifest["recipe"]["epochs"] == 2 and manifest["recipe"]["dataset"] == "npz"
    assert manifest["metrics"]["clean_accuracy"] > 0.5  # 500 images, 2 epochs: well above chance
    monkeypatch.setenv("AISAFETY_ZOO_PATH", str(out))
    predictor = load_zoo_model("tiny")
    with torch.inference_mode():
        accuracy = (predictor.predict(data.x[1::2]) == data.y[1::2]).float().mean().item()
    assert accuracy == pytest.approx(manifest["metrics"]["clean_accuracy"], abs=1e-6)


def test_pgd_trained_model_is_robust_where_the_vanilla_one_is_not():
    """The shipped PGD-AT model keeps most of its accuracy at eps 0.3; vanilla loses it all."""
    from aisafety.attack.pgd import PGDLinf

    data = EmbeddedMnist().load(None, "test").balanced_subset(200)
    attack = PGDLinf(steps=20, step_size=0.02)
    robust = attack(load_zoo_model("mnist-cnn-pgd-at"), data.x, data.y, 0.3).robust_accuracy
    vanilla = attack(load_zoo_model("mnist-cnn"), data.x, data.y, 0.3).robust_accuracy
    assert robust >= 0.75 and vanilla <= 0.05
    recipe = list_models()["mnist-cnn-pgd-at"][0].recipe
    assert recipe.defense == "pgd-at" and recipe.defense_config["eps"] == 0.3
