"""A network that normalises its own input, given a ``mean``/``std`` too, is fed its inputs
normalised twice: its ONNX graph (``graph_range``, as ``aisafety verify``) or its first
PyTorch/TorchScript submodule says so, and the run stores a warning naming the model, both
normalisations and the fix (prediction/own_normalisation.py, docs/own-model.md)."""

from __future__ import annotations

import io
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

import aisafety
from aisafety.errors import NormalisedTwiceWarning
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model
from aisafety.prediction.own_normalisation import own_normalisation
from aisafety.prediction.torch_module import Normalize, TorchPredictor
from aisafety.store.results import ResultStore

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class TorchvisionNormalize(nn.Module):
    """torchvision.transforms.Normalize's shape (not installed here): lists, not buffers."""

    def __init__(self, mean, std):
        super().__init__()
        self.mean, self.std = list(mean), list(std)

    def forward(self, x):
        return (x - torch.tensor(self.mean).view(1, -1, 1, 1)) / torch.tensor(self.std).view(
            1, -1, 1, 1
        )


TorchvisionNormalize.__name__ = "Normalize"


class ImageNormalizer(nn.Module):
    """RobustBench's ImageNet wrapper: buffers ``mean`` and ``std``."""

    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1))

    def forward(self, x):
        return (x - self.mean) / self.std


class MuSigmaNet(nn.Module):
    """RobustBench's CIFAR nets: ``(x - self.mu) / self.sigma`` first in forward."""

    def __init__(self, mean=MEAN):
        super().__init__()
        self.register_buffer("mu", torch.tensor(mean).view(1, 3, 1, 1))
        self.register_buffer("sigma", torch.tensor(STD).view(1, 3, 1, 1))
        self.fc = nn.Linear(3 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(((x - self.mu) / self.sigma).flatten(1))


def _head() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 10))


SELF_NORMALISING = {
    "ours": lambda: nn.Sequential(Normalize(MEAN, STD), _head()),
    "torchvision": lambda: nn.Sequential(TorchvisionNormalize(MEAN, STD), _head()),
    "robustbench-imagenet": lambda: nn.Sequential(
        OrderedDict([("normalize", ImageNormalizer(MEAN, STD)), ("model", _head())])
    ),
    "robustbench-cifar": MuSigmaNet,
    "nested": lambda: nn.Sequential(nn.Sequential(Normalize(MEAN, STD), nn.Identity()), _head()),
}


@pytest.mark.parametrize("kind", sorted(SELF_NORMALISING))
def test_a_module_that_normalises_itself_is_recognised(kind):
    found = own_normalisation(SELF_NORMALISING[kind]())
    assert found is not None and "mean (0.4914, 0.4822, 0.4465)" in found
    assert "std (0.247, 0.2435, 0.2616)" in found


def test_a_torchscript_archive_is_read_too_scripted_or_traced():
    scripted = torch.jit.script(MuSigmaNet())
    traced = torch.jit.trace(nn.Sequential(Normalize(MEAN, STD), _head()), torch.rand(2, 3, 4, 4))
    for compiled, kind in ((scripted, "MuSigmaNet.mu/sigma"), (traced, "Normalize")):
        buffer = io.BytesIO()
        torch.jit.save(compiled, buffer)
        found = own_normalisation(torch.jit.load(io.BytesIO(buffer.getvalue())))
        assert found is not None and found.startswith(f"{kind} mean (0.4914, 0.4822, 0.4465)")


@pytest.mark.parametrize(
    "net",
    [_head(), MuSigmaNet(mean=(0.0, 0.0, 0.0)), nn.Sequential(nn.BatchNorm2d(3), _head())],
    ids=["plain", "identity-mean-0", "batchnorm-first"],
)
def test_nothing_is_found_where_nothing_normalises(net):
    assert own_normalisation(net) is None


def test_the_predictor_notes_it_only_for_a_normalising_mean():
    net = MuSigmaNet()
    assert TorchPredictor(net, (3, 4, 4), 10).normalised_twice is None
    assert TorchPredictor(net, (3, 4, 4), 10, mean=MEAN, std=STD).normalised_twice == (
        "mean (0.4914, 0.4822, 0.4465) std (0.247, 0.2435, 0.2616)",
        "MuSigmaNet.mu/sigma mean (0.4914, 0.4822, 0.4465) std (0.247, 0.2435, 0.2616)",
    )
    pixels = TorchPredictor(net, (3, 4, 4), 10, mean=(0, 0, 0), std=(1 / 255,) * 3)
    assert pixels.normalised_twice is None  # a change of units (0..255 pixels), not twice
    assert TorchPredictor(_head(), (3, 4, 4), 10, mean=MEAN, std=STD).normalised_twice is None


class Raising(nn.Module):
    """``mu`` a buffer, ``sigma`` a property that raises."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mu", torch.tensor(MEAN).view(1, 3, 1, 1))
        self.fc = _head()

    @property
    def sigma(self):
        raise RuntimeError("a user's attribute that raises")

    def forward(self, x):
        return self.fc(x - self.mu)


def test_a_module_whose_attribute_raises_still_loads_unflagged():
    predictor = TorchPredictor(Raising(), (3, 4, 4), 10, mean=MEAN, std=STD)
    assert predictor.normalised_twice is None  # a hint, never a failed load


def _data(n: int = 20):
    rng = np.random.default_rng(0)
    return rng.random((n, 3, 4, 4), dtype=np.float32), rng.integers(0, 10, n)


def _stored(db: str, record) -> list[str]:
    """The run's own stored warnings of this kind (the report's badge: "normalised twice")."""
    rows = ResultStore(db).run_warnings(record.run_id)
    return [t for unit, kind, t in rows if unit is None and kind == "NormalisedTwiceWarning"]


PLAN = {"metrics": ["ca"]}


def test_evaluate_stores_the_warning_naming_model_both_normalisations_and_fix(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    net = nn.Sequential(Normalize(MEAN, STD), _head())
    with pytest.warns(NormalisedTwiceWarning, match="normalised twice"):
        record = aisafety.evaluate(
            PLAN, db, model=net, data=_data(), name="selfnorm", mean=MEAN, std=STD
        )
    (text,) = _stored(db, record)
    assert text.startswith("model 'selfnorm' normalises its input itself (Normalize mean")
    assert "and the mean (0.4914, 0.4822, 0.4465) std (0.247, 0.2435, 0.2616) given" in text
    assert "Drop mean and std for this model" in text


def _onnx(path, mean: float) -> str:
    """(x - mean) / 0.25, then Flatten and Gemm: a graph that normalises its own input."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed: pip install '.[onnx]'")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: '.[onnx]'")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([mean], np.float32), "m"),
        numpy_helper.from_array(np.array([0.25], np.float32), "s"),
        numpy_helper.from_array(rng.standard_normal((10, 48)).astype(np.float32), "W"),
        numpy_helper.from_array(np.zeros(10, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Sub", ["x", "m"], ["c"]),
        helper.make_node("Div", ["c", "s"], ["n"]),
        helper.make_node("Flatten", ["n"], ["f"]),
        helper.make_node("Gemm", ["f", "W", "b"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def test_an_onnx_plan_stores_the_warning_as_aisafety_verify_gives_it(tmp_path):
    path = _onnx(tmp_path / "net.onnx", 0.5)
    model = {"name": "onnxnet", "source": "onnx", "path": path, "mean": [0.5], "std": [0.25]}
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.warns(NormalisedTwiceWarning, match="normalised twice"):
        record = aisafety.evaluate({**PLAN, "model": model}, db, data=_data())
    (text,) = _stored(db, record)
    assert "model 'onnxnet' normalises its input itself (ONNX graph: its own normalisation " in text
    assert "(Sub 0.5, then Div) takes [0, 1] pixels), and the mean (0.5) std (0.25)" in text
    spec = ModelSpec(name="n", source="onnx", path=path, input_shape=(3, 4, 4))
    assert load_model(spec, torch.device("cpu"))[0].normalised_twice is None  # no mean/std
    plain = ModelSpec(**{**spec.model_dump(), "path": _onnx(tmp_path / "p.onnx", 0.0)})
    given = plain.model_copy(update={"mean": (0.5,), "std": (0.25,)})
    assert load_model(given, torch.device("cpu"))[0].normalised_twice is None  # Sub 0: no sign
