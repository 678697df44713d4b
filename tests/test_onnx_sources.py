"""ONNX as exported today: one small CIFAR ResNet (residual Add, BatchNorm,
AdaptiveAvgPool2d), exported by torch's dynamo exporter (opset 18), by the legacy one (opset 9
and 17, with and without constant folding), behind a channels-last (NHWC) input, and with a
batch of 1 hard-coded in a Reshape: each gives the torch module's logits and runs a plan with
a gradient attack, the AutoAttack ensemble, neuron coverage, rdi and CROWN certification."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from aisafety.cli import main
from aisafety.errors import ConfigError
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model
from aisafety.store.results import ResultStore
from tests.eran_cifar import eran_cifar10

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


class Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class TinyResNet(nn.Module):
    """A CIFAR-shaped ResNet: strided stem, one residual block, global average pool."""

    def __init__(self, channels: int = 6, flatten_batch: int | None = None):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=4, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.block = Block(channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, 10)
        self.flatten_batch = flatten_batch  # a batch size written into the graph's Reshape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(torch.relu(self.bn(self.stem(x))))
        pooled = self.pool(x)
        if self.flatten_batch is None:
            return self.fc(torch.flatten(pooled, 1))
        return self.fc(pooled.reshape(self.flatten_batch, -1))


class ChannelsLastInput(nn.Module):
    """What a Keras/TF converter writes: an NHWC input transposed inside the graph."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.permute(0, 3, 1, 2))


def tiny_resnet() -> TinyResNet:
    """Trained-looking statistics; the BatchNorm affine parameters stay at their defaults,
    so the legacy exporter de-duplicates them into Identity nodes (the 'onnx::Conv_NN'
    KeyError onnx2torch raises on its own)."""
    torch.manual_seed(0)
    module = TinyResNet()
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.running_mean.uniform_(-0.2, 0.2)
            layer.running_var.uniform_(0.5, 1.5)
    return module.eval()


def export(module: nn.Module, way: str, path) -> dict:
    """Export ``module`` the named way; the plan fields the file then needs."""
    x = torch.zeros(1, 3, 32, 32)
    batch = {"x": {0: "batch"}}
    legacy = {"dynamo": False, "input_names": ["x"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if way == "dynamo":
            if importlib.util.find_spec("onnxscript") is None:
                pytest.skip("torch's dynamo exporter needs onnxscript")
            dims = {"x": {0: torch.export.Dim("batch")}}
            torch.onnx.export(module, (x,), str(path), dynamo=True, dynamic_shapes=dims,
                              input_names=["x"])  # fmt: skip
        elif way.startswith("legacy"):
            opset, fold = int(way.split("-")[1]), way.endswith("-fold")
            torch.onnx.export(module, (x,), str(path), opset_version=opset,
                              do_constant_folding=fold, dynamic_axes=batch, **legacy)  # fmt: skip
        elif way == "nhwc":
            nhwc = ChannelsLastInput(module).eval()
            torch.onnx.export(nhwc, (x.permute(0, 2, 3, 1),), str(path), opset_version=13,
                              dynamic_axes=batch, **legacy)  # fmt: skip
            return {"layout": "nhwc"}
        elif way == "batch1-reshape":
            fixed = TinyResNet(flatten_batch=1)
            fixed.load_state_dict(module.state_dict())
            torch.onnx.export(fixed.eval(), (x,), str(path), opset_version=11, **legacy)
        else:
            raise ValueError(way)
    return {}


WAYS = ["dynamo", "legacy-9-fold", "legacy-9-nofold", "legacy-17-fold", "legacy-17-nofold",
        "nhwc", "batch1-reshape"]  # fmt: skip


@pytest.mark.parametrize("way", WAYS)
def test_exported_graph_gives_the_modules_logits(tmp_path, way):
    module = tiny_resnet()
    fields = export(module, way, tmp_path / "tiny.onnx")
    spec = ModelSpec(name=f"tiny-{way}", source="onnx", path=tmp_path / "tiny.onnx",
                     gradients=True, **fields)  # fmt: skip
    predictor, _ = load_model(spec, torch.device("cpu"))
    images, _ = eran_cifar10(20)
    x = torch.from_numpy(images).float() / 255
    with torch.no_grad():
        difference = float((predictor.logits(x) - module(x)).abs().max())
    print(f"{way}: max |onnx - torch| logit difference {difference:.3g}")
    assert difference < 1e-4
    assert predictor.name == f"tiny-{way}"


@pytest.mark.parametrize("gradients", [False, True])
def test_layout_nhwc_on_a_channels_first_graph_is_refused_at_load(tmp_path, gradients):
    """It was read as (H, W, C) = (3, 32, 32) and the first batch was refused with "takes
    batches of shape (N, 32, 3, 32) ... add a batch dimension or resize the images"."""
    export(tiny_resnet(), "legacy-17-fold", tmp_path / "tiny.onnx")
    spec = ModelSpec(name="tiny", source="onnx", path=tmp_path / "tiny.onnx",
                     gradients=gradients, layout="nhwc")  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_model(spec, torch.device("cpu"))
    message = str(caught.value)
    assert "layout is nhwc, but the graph's input ['batch', 3, 32, 32] is channels-first" in message
    assert "remove layout: nhwc" in message


PLAN = """
model: {{name: tiny-{way}, source: onnx, path: tiny.onnx, gradients: true{extra}}}
dataset: {{name: npz, path: cifar.npz, limit: 10}}
attacks:
  - {{name: pgd-linf, config: {{steps: 10, step_size: 0.0005}}, eps: [0.002]}}
  - {{name: standard, config: {{steps: 3, queries: 30}}, eps: [0.002]}}
metrics:
  - ca
  - robust-accuracy
  - {{name: tkncov, config: {{k: 2}}}}
  - rdi
  - {{name: certified-accuracy, config: {{verifier: crown, eps: 0.002,
      verifier_config: {{batch_size: 5, clock: cpu}}, attack_config: {{steps: 5}}}}}}
"""


@pytest.mark.parametrize("way", WAYS)
def test_exported_graph_runs_attacks_coverage_rdi_and_crown(tmp_path, way, capsys):
    module = tiny_resnet()
    fields = export(module, way, tmp_path / "tiny.onnx")
    images, _ = eran_cifar10(10)  # labelled by the untrained net itself: every image counts
    with torch.no_grad():
        labels = module(torch.from_numpy(images).float() / 255).argmax(1).numpy()
    np.savez(tmp_path / "cifar.npz", x=images, y=labels)
    extra = "".join(f", {k}: {v}" for k, v in fields.items())
    (tmp_path / "plan.yaml").write_text(PLAN.format(way=way, extra=extra))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(tmp_path / "plan.yaml"), "--db", db, "--quiet"]) == 0
    _, rows = ResultStore(db).query("SELECT model, metric, value FROM results")
    values = {metric: value for _, metric, value in rows}
    print(way, values)
    assert {model for model, _, _ in rows} == {f"tiny-{way}"}
    found = {}
    for stem in ("ca", "robust-accuracy", "tkncov", "rdi", "certified-accuracy"):
        hits = [v for m, v in values.items() if m.split("(")[0] == stem]
        assert len(hits) == 1 and hits[0] is not None, (stem, values)
        found[stem] = hits[0]
    assert found["ca"] == 1.0
    # sound: nothing certified at 0.002 that PGD breaks at 0.002; CROWN certifies some
    assert 0 < found["certified-accuracy"] <= found["robust-accuracy"]


def test_an_unconvertible_graph_is_refused_by_the_plans_model_name(tmp_path):
    """The message names the model as the plan does (not 'onnx-model'), the operator, and
    the way on (scores only)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 48])
    nodes = [helper.make_node("Shrink", ["x"], ["h"]), helper.make_node("Flatten", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "odd.onnx"))
    spec = ModelSpec(name="my-net", source="onnx", path=tmp_path / "odd.onnx", gradients=True)
    from aisafety.prediction.onnx_model import OnnxConversionError

    with pytest.raises(OnnxConversionError) as caught:
        load_model(spec, torch.device("cpu"))
    message = str(caught.value)
    assert "'my-net'" in message and "Shrink" in message and "gradients: false" in message
    assert "onnx-model" not in message


def test_input_domain_fields_fold_into_the_normalisation_and_are_refused_where_unused():
    """scale 255 with mean/std in 0..255 units is the [0, 1] normalisation (x - m/255) /
    (s/255); layout is read by ONNX models only."""
    from aisafety.loading import normalisation

    spec = ModelSpec(name="n", source="onnx", path="n.onnx", scale=255, mean=(127.5,), std=(64,))
    mean, std = normalisation(spec)
    assert mean == pytest.approx((0.5,)) and std == pytest.approx((64 / 255,))
    assert normalisation(ModelSpec(name="n", source="onnx", path="n.onnx", scale=255)) == (
        pytest.approx((0.0,)),
        pytest.approx((1 / 255,)),
    )
    with pytest.raises(ValueError, match="layout is not used by a torchscript model"):
        ModelSpec(name="n", source="torchscript", path="n.pt", input_shape=(3, 4, 4),
                  layout="nhwc")  # fmt: skip


def test_onnx2torch_batchnorm_with_computed_statistics_is_bounded_soundly(tmp_path):
    """A BatchNormalization whose parameters are not initializers (here ``Constant`` nodes)
    becomes onnx2torch's ``OnnxBatchNorm``; the bound graph reads it as an elementwise affine
    map, and CROWN's bound on the graph lies below the true margin at random box points."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from aisafety.plugins import default_registry
    from aisafety.prediction.onnx_model import load_onnx
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property
    from aisafety.verification.registry import make_verifier

    rng = np.random.default_rng(0)

    def constant(name: str, values: np.ndarray):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(values))

    stats = {"s": rng.uniform(0.5, 1.5, 3), "b": rng.uniform(-0.3, 0.3, 3),
             "m": rng.uniform(-0.2, 0.2, 3), "v": rng.uniform(0.5, 1.5, 3)}  # fmt: skip
    nodes = [constant(k, v.astype(np.float32)) for k, v in stats.items()]
    nodes += [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w"], ["y"], transB=1),
    ]
    weight = numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph(nodes, "bn", [x], [y], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "bn.onnx"))

    predictor = load_onnx(tmp_path / "bn.onnx", gradients=True, name="bn-net")
    kinds = {type(m).__name__ for m in predictor.network.modules()}
    assert "OnnxBatchNorm" in kinds and "OnnxGlobalAveragePoolWithKnownInputShape" in kinds
    bound_graph = build_graph(predictor.network, (3, 4, 4), "bn-net")
    images = torch.rand(4, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    labels = predictor.logits(images).argmax(1)
    prop = robustness_property(images, labels, 0.05, 4)
    bounds, _ = make_verifier(default_registry(), "crown").lower_bounds(bound_graph, prop)
    noise = torch.rand(256, 1, 3, 4, 4, dtype=torch.float64)
    points = prop.lower + (prop.upper - prop.lower) * noise  # 256 batches of the 4 boxes
    for point in points:
        true = prop.rows(predictor.logits(point.float()).double())
        assert (bounds <= true + 1e-5).all()


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_a_gelu_of_opset_20_converts_with_its_gradients(tmp_path, approximate):
    """torch writes nn.GELU (a ViT's MLP) as the opset-20 Gelu operator, its default opset,
    which onnx2torch 1.5 cannot convert: a ViT-B/16 exported as usual was refused with
    gradients: true (session 21, an ImageNet user's audit). The converted graph gives the
    module's logits and input gradients (and load_onnx checks it against onnxruntime)."""
    import onnx

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 8), nn.GELU(approximate), nn.Linear(8, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(1, 3, 4, 4),), str(tmp_path / "g.onnx"),
                          opset_version=20, dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})  # fmt: skip
    assert "Gelu" in {n.op_type for n in onnx.load(str(tmp_path / "g.onnx")).graph.node}
    spec = ModelSpec(name="g", source="onnx", path=tmp_path / "g.onnx", gradients=True)
    predictor, _ = load_model(spec, torch.device("cpu"))
    x = torch.rand(5, 3, 4, 4, requires_grad=True)
    converted, ours = predictor.logits(x), net(x)
    assert float((converted - ours).abs().max()) < 1e-6
    (mine,) = torch.autograd.grad(converted[:, 0].sum(), x)
    (theirs,) = torch.autograd.grad(ours[:, 0].sum(), x)
    assert float((mine - theirs).abs().max()) < 1e-6
