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
from tests.shared_data import shared_folder


def test_shipped_model_reaches_98_percent_on_full_mnist_test():
    predictor = load_zoo_model("mnist-cnn")
    test = MnistDataset().load(shared_folder("mnist"), "test")
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


def test_embedded_subset_is_the_first_100_of_each_class_of_the_real_test_set():
    data = EmbeddedMnist().load(None, "test")
    full = MnistDataset().load(shared_folder("mnist"), "test")
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


def _tiny_npz_dataset(folder: Path, test_step: int = 2) -> None:
    """The embedded 1,000 images as an npz dataset: the even ones (500) to train on, every
    ``test_step``-th odd one to test (500 by default)."""
    data = EmbeddedMnist().load(None, "test")
    x = (data.x[:, 0] * 255).round().to(torch.uint8).numpy()
    np.savez(folder / "train.npz", x=x[::2], y=data.y[::2].numpy())
    test = slice(1, None, test_step)
    np.savez(folder / "test.npz", x=x[test], y=data.y[test].numpy())


def test_zoo_train_writes_checkpoint_and_manifest_that_load(tmp_path, monkeypatch):
    data = EmbeddedMnist().load(None, "test")
    _tiny_npz_dataset(tmp_path)
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
    # the robustness subset of a 500-image test split is the whole split
    assert accuracy == pytest.approx(manifest["metrics"]["subset_clean_accuracy"], abs=1e-6)


def test_zoo_train_records_robust_and_certified_accuracy_at_the_training_eps(tmp_path, monkeypatch):
    from aisafety.zoo_build import pgd_robust_accuracy

    # 250 test images: PGD-40 runs on all of them twice (recorded, then again here)
    _tiny_npz_dataset(tmp_path, test_step=4)
    out = tmp_path / "zoo"
    code = main(
        ["zoo", "train", "--dataset", "npz", "--data-dir", str(tmp_path), "--name", "tiny-ibp",
         "--out", str(out), "--epochs", "1", "--defense", "ibp", "--defense-config",
         '{"eps": 0.1}', "--quiet"]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads((out / "manifest.json").read_text())["tiny-ibp"]["metrics"]
    assert metrics["robust_samples"] == 250  # the npz test split: 250 images, all classes
    certified = metrics["ibp_certified_accuracy_eps0.1"]
    robust = metrics["pgd40_robust_accuracy_eps0.1"]
    assert 0 <= certified <= robust <= metrics["clean_accuracy"]
    test = tmp_path / "test.npz"
    with np.load(test) as arrays:
        x = torch.from_numpy(arrays["x"]).float().div(255)[:, None]
        y = torch.from_numpy(arrays["y"]).long()
    monkeypatch.setenv("AISAFETY_ZOO_PATH", str(out))
    # the whole 250-image split, in file order: the same images and random stream as recorded
    again = pgd_robust_accuracy(load_zoo_model("tiny-ibp"), x, y, 0.1)
    assert again == pytest.approx(robust, abs=1e-9)


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


# --- the zoo of defended models: every shipped entry against the numbers it claims ----------

SHIPPED = sorted(json.loads((Path(str(builtin_zoo())) / "manifest.json").read_text()))


def _test_set(dataset: str):
    from aisafety.database.datasets.idx import FashionMnistDataset

    folder = shared_folder(dataset)
    source = MnistDataset() if dataset == "mnist" else FashionMnistDataset()
    return source.load(folder, "test")


def _robust_subset(dataset: str):
    if dataset == "mnist":
        return EmbeddedMnist().load(None, "test")
    return _test_set(dataset).balanced_subset(1000, 0)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_entry_clean_accuracy_agrees_on_the_1000_image_subset(name):
    """Entries recorded since the subset accuracy is measured compare with it (a weak
    model's accuracy on the class-balanced 1,000 can sit several points from the full test
    set's: sok-fcnn-a-cadv3 39.8% vs 45.5%); older ones with the full test set's."""
    entry = list_models()[name][0]
    data = _robust_subset(entry.dataset)
    with torch.inference_mode():
        accuracy = (load_zoo_model(name).predict(data.x) == data.y).double().mean().item()
    reference = entry.metrics.get("subset_clean_accuracy", entry.metrics["clean_accuracy"])
    assert accuracy == pytest.approx(reference, abs=0.03)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_entry_has_its_recorded_clean_accuracy_on_the_full_test_set(name):
    entry = list_models()[name][0]
    test = _test_set(entry.dataset)
    predictor = load_zoo_model(name)  # also re-checks the sha256
    with torch.inference_mode():
        predictions = torch.cat([predictor.predict(b) for b in test.x.split(2000)])
    accuracy = (predictions == test.y).double().mean().item()
    assert accuracy == pytest.approx(entry.metrics["clean_accuracy"], abs=1e-4)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_entry_robust_accuracy_agrees_on_a_cheap_subset(name, zoo_pgd40_survivors):
    """PGD-40 on 200 of the 1,000 images: within 0.1 of the recorded 1,000-image number
    (an MNIST entry's run is conftest's ``zoo_pgd40_survivors``, shared with the paper-defense
    tests that check the same run)."""
    from aisafety.zoo_build import pgd_robust_accuracy

    entry = list_models()[name][0]
    claims = {k: v for k, v in entry.metrics.items() if k.startswith("pgd40_robust_accuracy")}
    if not claims:
        pytest.skip(f"{name} records no robust accuracy")
    key = max(claims)  # the largest recorded eps is the cheapest to get wrong
    eps = float(key.removeprefix("pgd40_robust_accuracy_eps"))
    if entry.dataset == "mnist":
        measured = zoo_pgd40_survivors(name, eps).double().mean().item()
    else:
        data = _robust_subset(entry.dataset)
        measured = pgd_robust_accuracy(load_zoo_model(name), data.x[::5], data.y[::5], eps)
    assert measured == pytest.approx(claims[key], abs=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_entry_robust_and_certified_accuracy_exactly(name):
    """The full 1,000-image PGD-40 and IBP numbers, and certified <= robust <= clean."""
    from aisafety.evaluation.metrics.certified import ibp_certified_mask
    from aisafety.zoo_build import pgd_robust_accuracy

    entry = list_models()[name][0]
    predictor = load_zoo_model(name)
    data = _robust_subset(entry.dataset)
    every = int(entry.metrics.get("robust_every", 1))  # the images the entry was measured on
    data = type(data)(data.name, data.x[::every], data.y[::every], data.classes)
    for key, claim in entry.metrics.items():
        if key.startswith("pgd40_robust_accuracy_eps"):
            eps = float(key.removeprefix("pgd40_robust_accuracy_eps"))
            robust = pgd_robust_accuracy(predictor, data.x, data.y, eps)
            assert robust == pytest.approx(claim, abs=0.003)
        if key.startswith("ibp_certified_accuracy_eps"):
            eps = float(key.removeprefix("ibp_certified_accuracy_eps"))
            mask = ibp_certified_mask(predictor.network, data.x, data.y, eps)
            assert mask.double().mean().item() == pytest.approx(claim, abs=1e-3)
            robust_key = f"pgd40_robust_accuracy_eps{eps:g}"
            assert claim <= entry.metrics.get(robust_key, 1.0) <= entry.metrics["clean_accuracy"]


def test_zoo_meets_the_defense_targets_it_claims():
    """Issue 5's bar, read from the manifest (the two tests above check the numbers)."""
    metrics = {name: entry.metrics for name, (entry, _) in list_models().items()}
    assert metrics["mnist-cnn"]["pgd40_robust_accuracy_eps0.3"] < 0.05
    assert metrics["mnist-cnn-pgd-at-ft2"]["pgd40_robust_accuracy_eps0.3"] >= 0.85
    assert metrics["mnist-cnn-trades-5"]["pgd40_robust_accuracy_eps0.3"] >= 0.85
    assert metrics["mnist-cnn-strided-crown-ibp"]["ibp_certified_accuracy_eps0.1"] >= 0.70
    # no bar in the issue for AH: it must at least be a robust model where vanilla is not
    assert metrics["mnist-cnn-ah"]["pgd40_robust_accuracy_eps0.3"] >= 0.70


# The zoo's entries were trained on a 2-core machine, and the CPU kernels sum in an order
# that depends on the thread count: on one thread training takes another trajectory
# (mnist-cnn's PGD-40 at 0.1 came out 0.653 against the shipped 0.643 with OMP_NUM_THREADS=1).
SHIPPED_TRAINING_THREADS = 2


def _reproduce(name: str, out: Path) -> tuple[dict, dict]:
    """``aisafety zoo train --recipe-of name``: the shipped metrics and the retrained ones."""
    mnist = shared_folder("mnist")
    threads = torch.get_num_threads()
    torch.set_num_threads(SHIPPED_TRAINING_THREADS)
    try:
        code = main(
            ["zoo", "train", "--recipe-of", name, "--data-dir", str(mnist), "--out",
             str(out), "--quiet"]
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    again = json.loads((out / "manifest.json").read_text())[name]
    shipped = list_models()[name][0]
    assert again["recipe"] == shipped.recipe.model_dump(mode="json")
    return shipped.metrics, again["metrics"]


def _assert_within_one_point(shipped: dict, again: dict) -> None:
    measured = [key for key in shipped if "accuracy" in key]
    assert {"clean_accuracy", "pgd40_robust_accuracy_eps0.1"} <= set(measured) <= set(again)
    for key in measured:
        assert again[key] == pytest.approx(shipped[key], abs=0.01), key


@pytest.mark.slow
def test_zoo_train_reproduces_the_vanilla_entry_from_its_recipe(tmp_path):
    """``mnist-cnn`` (3 epochs, no attack in the loop: the cheapest entry) retrained from its
    manifest recipe: clean and PGD-40 robust accuracy at 0.1 and 0.3 within 1 point.

    Retrained at the thread count the entry was trained with (``_reproduce``). Slow: 1,407
    Adam steps and PGD-40 on 1,000 images twice, 35 s of an idle CI machine, the default
    suite's largest test (it kept the suite over 15 minutes)."""
    _assert_within_one_point(*_reproduce("mnist-cnn", tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mnist-cnn-gaussian-0.25", "mnist-cnn-pgd-at"])
def test_zoo_train_reproduces_a_defended_entry_from_its_recipe(tmp_path, name):
    """Defended entries retrained from their recipes: every recorded accuracy within 1 point."""
    _assert_within_one_point(*_reproduce(name, tmp_path))


def test_recipe_of_takes_the_entry_recipe_and_budgets_and_options_override_them():
    from aisafety.cli import build_parser
    from aisafety.cli.zoo import zoo_recipe

    def parse(*options: str):
        return zoo_recipe(build_parser().parse_args(["zoo", "train", "--data-dir", ".", *options]))

    shipped = list_models()["mnist-cnn-strided-crown-ibp"][0]
    recipe, robust, certified = parse("--recipe-of", "mnist-cnn-strided-crown-ibp")
    assert recipe == shipped.recipe and robust == [0.1, 0.2] and certified == [0.1, 0.2]
    recipe, robust, certified = parse(
        "--recipe-of", "mnist-cnn-strided-crown-ibp", "--epochs", "1", "--robust-eps", "0.2", "0.3"
    )
    assert recipe.epochs == 1 and recipe.defense == "crown-ibp" and robust == [0.2, 0.3]
    recipe, robust, certified = parse("--defense", "pgd-at", "--defense-config", '{"eps": 0.3}')
    assert recipe.architecture == "mnist-cnn" and recipe.defense_config == {"eps": 0.3}
    assert robust is None and certified is None  # the training eps, decided by train_zoo_entry
    with pytest.raises(UnknownNameError, match="mnist-cnn-pgd-at"):
        parse("--recipe-of", "mnist-cnn-pgd")
