"""A model with another number of outputs than the dataset's classes is named in a warning:
a CIFAR-100 network on CIFAR-10's labels (in its range) ran without a word, and so would an
ImageNet network on an image folder of a few ImageNet classes labelled 0..K-1."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import aisafety
from aisafety.config import plan_from_dict
from aisafety.evaluation.class_count import class_count_warning
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


def test_the_text_names_both_counts_and_only_a_difference():
    message = class_count_warning("cifar10", 10, "wrn", 100)
    assert message.startswith("dataset 'cifar10' has 10 classes and model 'wrn' has 100 outputs")
    assert "its own output indices" in message
    assert class_count_warning("cifar10", 10, "wrn", 10) is None
    assert class_count_warning("empty", 0, "wrn", 10) is None


def outputs(classes: int = 100) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, classes))


def _caught(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if "outputs: label i" in str(w.message)]


@pytest.mark.parametrize("classes, warned", [(100, True), (10, False)])
def test_a_named_datasets_classes_are_compared_with_the_outputs(classes, warned, tmp_path):
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], "dataset": {"limit": 4}}, "p")
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    predictor = TorchPredictor(outputs(classes), (1, 28, 28), classes, name="m")
    found = _caught(lambda: Runner(plan, store, quiet=True, model=(predictor, "m")).run())
    assert len(found) == warned
    if warned:
        assert found[0].startswith("dataset 'mnist-embedded' has 10 classes and model 'm' has 100")


def _npz(tmp_path, named: bool) -> str:
    rng = np.random.default_rng(0)
    arrays = {"x": rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), "y": np.arange(4)}
    if named:
        arrays["classes"] = np.array([f"c{k}" for k in range(10)])
    np.savez(tmp_path / "d.npz", **arrays)
    return str(tmp_path / "d.npz")


@pytest.mark.parametrize("named", [True, False])
def test_an_npz_is_compared_only_when_it_names_its_classes(named, tmp_path):
    fields = {"dataset": {"name": "npz", "path": _npz(tmp_path, named)}, "metrics": ["ca"]}
    plan = plan_from_dict({"device": "cpu", **fields}, "p")
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    predictor = TorchPredictor(outputs(), (1, 28, 28), 100, name="m")
    found = _caught(lambda: Runner(plan, store, quiet=True, model=(predictor, "m")).run())
    assert len(found) == named  # labels 0..3 without names: the label set is unknown


def test_arrays_handed_in_number_their_classes_from_the_labels_and_are_not_compared(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    plan = {"metrics": ["ca"]}
    db = f"sqlite:///{tmp_path / 'r.db'}"
    run = lambda: aisafety.evaluate(plan, db, model=outputs(), data=(images, np.arange(4)))  # noqa: E731
    assert _caught(run) == []


def probabilities() -> nn.Module:
    return nn.Sequential(outputs(), nn.Softmax(1))


def test_a_ray_worker_hands_the_clean_pass_warnings_to_the_driver(tmp_path):
    """Both this file's and test_probabilities_output.py's: on Ray the clean pass runs on a
    worker, whose warnings do not reach the driver (executor.py warns what it returns)."""
    from aisafety.distributed.tasks import prepare

    model = {"name": "wide", "source": "python", "factory": f"{__name__}:probabilities"}
    fields = {"model": {**model, "input_shape": [1, 28, 28]}, "dataset": {"limit": 4}}
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], **fields}, "p")
    info, _ = prepare(plan, f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    starts = ("model 'wide' returns probabilities", "dataset 'mnist-embedded' has 10 classes")
    assert all(any(m.startswith(start) for m in info["warnings"]) for start in starts)
