"""A model with another class count than the dataset declares is named in a warning (a
CIFAR-100 model on CIFAR-10 labels ran without a word: labels in range, every number that of
another problem); data numbered from its labels declares no count and is not warned about."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from aisafety.config import plan_from_dict
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.npz import NpzDataset
from aisafety.evaluation.class_count import class_count_message
from aisafety.in_memory import in_memory_data
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.interruption import HANG_ENDS_PROCESS
from aisafety.store.results import ResultStore


class _Pooled(nn.Module):
    """Channel means -> ``classes`` logits: any image size, any class count."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(channels, classes)

    def forward(self, x):
        return self.linear(x.mean((2, 3)))


def _class_warnings(tmp_path, dataset: dict, shape: tuple, classes: int) -> list[str]:
    """The class-count warnings of a ``ca`` run of a ``classes``-way model on ``dataset``."""
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], "dataset": dataset}, "p")
    predictor = TorchPredictor(_Pooled(shape[0], classes), shape, classes, name="wide")
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Runner(plan, store, quiet=True, model=(predictor, "wide")).run()
    return [str(w.message) for w in caught if "classes and dataset" in str(w.message)]


def test_a_cifar100_sized_model_on_cifar10_is_named(tmp_path):
    cifar = {"name": "cifar10-embedded", "limit": 4}
    (message,) = _class_warnings(tmp_path, cifar, (3, 32, 32), 100)
    assert message.startswith(
        "model 'wide' has 100 classes and dataset 'cifar10-embedded' declares 10: its labels "
        "are read as the model's class indices"
    )
    assert "over all 100 of the model's classes" in message
    assert _class_warnings(tmp_path, cifar, (3, 32, 32), 10) == []  # the same count: nothing


def _labelled_files(folder, labels: list[int]) -> None:
    """ImageNet-style files named ``<anything>_<class index>.png`` (imagenet-samples)."""
    for i, label in enumerate(labels):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(folder / f"im{i}_{label}.png")


def test_a_1000_class_model_on_a_few_imagenet_images_is_not_warned(tmp_path):
    """imagenet-samples declares the 1,000 classes whatever few labels its files carry."""
    folder = tmp_path / "images"
    folder.mkdir()
    _labelled_files(folder, [243, 559, 990])
    data = {"name": "imagenet-samples", "path": str(folder)}
    assert _class_warnings(tmp_path, data, (3, 224, 224), 1000) == []
    (message,) = _class_warnings(tmp_path, data, (3, 224, 224), 1001)  # one class more: named
    assert "has 1001 classes and dataset 'imagenet-samples' declares 1000" in message


def test_only_a_declared_class_list_counts(tmp_path):
    """An npz without ``classes`` numbers its classes from its labels (0..4 here), which
    says nothing of how many the model should have; with ``classes`` it declares them."""
    x, y = np.zeros((5, 4, 4), np.uint8), np.arange(5)
    np.savez(tmp_path / "bare.npz", x=x, y=y)
    np.savez(tmp_path / "named.npz", x=x, y=y, classes=np.array([str(k) for k in range(5)]))
    bare = NpzDataset().load(tmp_path / "bare.npz", "test")
    named = NpzDataset().load(tmp_path / "named.npz", "test")
    assert not bare.declared and named.declared
    assert not bare.take([0, 1]).declared and named.take([0, 1]).declared  # subsets keep it
    assert not in_memory_data((x, y)).declared  # arrays handed to aisafety.evaluate
    ten = TorchPredictor(_Pooled(1, 10), (1, 4, 4), 10, name="ten")
    assert class_count_message(bare, ten) is None
    message = class_count_message(named, ten)
    assert message is not None and "has 10 classes and dataset 'npz' declares 5" in message
    bare_plan = {"name": "npz", "path": str(tmp_path / "bare.npz")}
    assert _class_warnings(tmp_path, bare_plan, (1, 4, 4), 10) == []


def twelve_classes() -> nn.Module:
    return _Pooled(1, 12)


def test_a_ray_worker_hands_the_warning_to_the_driver(tmp_path, monkeypatch):
    """On Ray the model and data are loaded on a worker, whose warnings do not reach the
    driver: the worker's prepare returns the message, the driver warns it (executor.py)."""
    from aisafety.distributed.tasks import prepare

    monkeypatch.setenv(HANG_ENDS_PROCESS, "")  # prepare sets it for the worker's process
    monkeypatch.chdir(tmp_path)  # and moves to the plan's folder
    model = {"name": "twelve", "source": "python", "factory": f"{__name__}:twelve_classes"}
    fields = {"model": {**model, "input_shape": [1, 28, 28]}, "dataset": {"limit": 4}}
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], **fields}, "p")
    info, _ = prepare(plan, f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    (message,) = [w.message for w in info["warnings"] if "classes and dataset" in w.message]
    assert message.startswith(
        "model 'twelve' has 12 classes and dataset 'mnist-embedded' declares 10"
    )


@pytest.mark.parametrize("declared", [5, 20])
def test_fewer_or_more_classes_than_declared_are_both_named(declared):
    names = tuple(str(k) for k in range(declared))
    data = LoadedDataset("set", torch.zeros(3, 1, 4, 4), torch.arange(3), names)
    message = class_count_message(data, TorchPredictor(_Pooled(1, 10), (1, 4, 4), 10))
    assert (
        message is not None and f"has 10 classes and dataset 'set' declares {declared}:" in message
    )
    same = TorchPredictor(_Pooled(1, declared), (1, 4, 4), declared)
    assert class_count_message(data, same) is None


CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _evaluate_warnings(tmp_path, **given) -> list[str]:
    """The class-count warnings of ``aisafety.evaluate`` with a 100-class model on ten
    CIFAR-shaped images labelled 0..9, ``given`` its other arguments."""
    import aisafety

    data = (torch.rand(10, 3, 32, 32), torch.arange(10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aisafety.evaluate(
            {"device": "cpu", "metrics": ["ca"]}, f"sqlite:///{tmp_path / 'r.db'}",
            model=_Pooled(3, 100), data=data, name="wide", **given,
        )  # fmt: skip
    return [str(w.message) for w in caught if "classes and dataset" in str(w.message)]


@pytest.mark.parametrize("classes", [CIFAR10, 10, np.array(CIFAR10)])
def test_data_handed_to_evaluate_declares_its_classes(tmp_path, classes):
    """aisafety.evaluate(data=...) had no way to declare its classes, so a CIFAR-100 model
    on CIFAR-10 arrays was never warned about; classes= (names in label order, or a count)
    declares them."""
    (message,) = _evaluate_warnings(tmp_path, classes=classes)
    assert message.startswith("model 'wide' has 100 classes and dataset 'arrays' declares 10")


def test_data_without_classes_still_declares_none(tmp_path):
    assert _evaluate_warnings(tmp_path) == []  # labels 0..9 say nothing of the count


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"classes": 5}, "data labels run up to 9, but classes= declares 5 classes"),
        ({"classes": 0}, "classes=0: give the number of classes"),
        ({"classes": "cat"}, "classes= takes the class names in label order"),
        ({"classes": [0, 1, 2]}, "classes= takes the class names in label order"),
    ],
)
def test_classes_that_do_not_fit_the_labels_are_refused(tmp_path, given, message):
    from aisafety.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        _evaluate_warnings(tmp_path, **given)


def test_classes_without_data_is_refused():
    import aisafety
    from aisafety.errors import ConfigError

    with pytest.raises(ConfigError, match="pass data=\\(images, labels\\) too"):
        aisafety.evaluate({"metrics": ["ca"]}, "sqlite://", classes=10)
