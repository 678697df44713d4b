"""A user's own CIFAR-shaped ResNet (residual Add, BatchNorm, AdaptiveAvgPool2d), brought in
by every source we build (python factory, plugin architecture + state dict, plugin model
entry, torch.export, TorchScript, the Python API): the same clean logits, and one plan with
pgd-linf, standard, neuron coverage, rdi and CROWN's certified accuracy, stored; where a
source cannot give a capability, the message that says which source would."""

from __future__ import annotations

import importlib
import json
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import aisafety
from aisafety.cli import main
from aisafety.database.datasets.embedded import EmbeddedCifar10
from aisafety.errors import CapabilityError, ConfigError, UnknownNameError
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import Architecture, EvaluationPlan, ModelEntry, ModelSpec
from aisafety.loading import load_model
from aisafety.plugins import build_registry
from aisafety.runner import Runner
from aisafety.store.results import ResultStore
from aisafety.verification import bounds
from aisafety.verification.graph import build_graph

MODULE = "own_model_tinyresnet"
NET_SOURCE = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)  # the residual Add


class TinyResNet(nn.Module):
    def __init__(self, width=8, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.block = Block(width)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.block(self.stem(x))), 1))
"""
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
N = 4  # images per plan: every source runs the whole plan, so keep it small
PLAN = {
    "dataset": {"name": "cifar10-embedded", "limit": N},
    "profile_dataset": {"name": "cifar10-embedded", "split": "test"},
    "attacks": [
        {"name": "pgd-linf", "eps": [2 / 255], "config": {"steps": 5}},
        {"name": "standard", "eps": [2 / 255], "config": {"steps": 2, "queries": 10}},
    ],
    "metrics": [
        {"name": "ca"},
        {"name": "robust-accuracy"},
        {"name": "tkncov"},
        {"name": "rdi"},
        {"name": "certified-accuracy", "config": {"eps": 0.5 / 255, "verifier": "crown"}},
    ],
}
STORED = ("ca", "robust-accuracy", "tkncov", "rdi", "certified-accuracy")


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """The net's module file, its trained-looking weights, and every saved form of it."""
    folder = tmp_path_factory.mktemp("own")
    (folder / f"{MODULE}.py").write_text(NET_SOURCE)
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(folder))
    torch.manual_seed(0)
    net = module.TinyResNet()
    net.train()
    with torch.no_grad():  # running statistics that are not the identity
        for _ in range(3):
            net(torch.rand(16, 3, 32, 32) * 2 - 0.5)
    net.eval()
    state = net.state_dict()
    torch.save({f"module.{k}": v for k, v in state.items()}, folder / "dataparallel.pt")
    lightning = {"epoch": 3, "state_dict": {f"model.{k}": v for k, v in state.items()}}
    torch.save(lightning, folder / "lightning.ckpt")
    normalised = torch.nn.Sequential(Normalise(MEAN, STD), net).eval()
    example = torch.rand(2, 3, 32, 32)
    batch = torch.export.Dim("batch")
    program = torch.export.export(net, (example,), dynamic_shapes=({0: batch},))
    torch.export.save(program, folder / "net.pt2")
    torch.export.save(torch.export.export(net, (example[:1],)), folder / "net-batch1.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(net), folder / "net.ts")
    x = EmbeddedCifar10().load(None, "test").x[:N]
    with torch.no_grad():
        reference = normalised(x)
    return types.SimpleNamespace(folder=folder, module=module, net=net, x=x, ref=reference)


class Normalise(torch.nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x):
        return (x - self.mean) / self.std


def _same_logits(predictor, own, label: str) -> None:
    with torch.no_grad():
        diff = float((predictor.logits(own.x) - own.ref).abs().max())
    print(f"{label}: max |logit difference| to the module = {diff:.3g}")
    assert diff < 1e-5


def _model(own, **fields) -> dict:
    return {"name": "tiny-resnet", "input_shape": [3, 32, 32], **fields}


def _plan_file(own, name: str, model: dict, **changes) -> Path:
    plan = {**PLAN, "model": model, **changes}
    path = own.folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def _stored(db: str) -> dict[str, float]:
    columns, rows = ResultStore(db).query("SELECT metric, value FROM results")
    return {metric: value for metric, value in rows}


def _assert_stored(db: str) -> None:
    stored = _stored(db)
    names = {metric.split("(")[0] for metric in stored}
    assert set(STORED) <= names, sorted(stored)
    assert all(np.isfinite(v) for v in stored.values())


# --- source: python ------------------------------------------------------------------------


def test_python_factory_from_the_plans_folder(own, tmp_path, capsys):
    model = _model(
        own, source="python", factory=f"{MODULE}:TinyResNet", kwargs={"width": 8},
        path="dataparallel.pt", mean=list(MEAN), std=list(STD),
    )  # fmt: skip
    plan = _plan_file(own, "python", model)
    sys.modules.pop(MODULE, None)  # found through the plan's folder, not an earlier import
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet"]) == 0
    _assert_stored(db)
    spec = ModelSpec.model_validate({**model, "path": str(own.folder / "dataparallel.pt")})
    spec = spec.model_copy(update={"python_path": (own.folder,)})
    predictor, fingerprint = load_model(spec, torch.device("cpu"))
    _same_logits(predictor, own, "python factory + DataParallel state dict")
    assert len(fingerprint) == 64


def test_python_factory_errors_name_the_problem(own, tmp_path):
    def load(**fields):
        spec = ModelSpec(**_model(own, source="python", python_path=(own.folder,), **fields))
        return load_model(spec, torch.device("cpu"))

    with pytest.raises(ConfigError, match="no module 'absent_module'"):
        load(factory="absent_module:Net")
    (own.folder / "needs_absent.py").write_text("import absent_dependency_xyz\n")
    with pytest.raises(ConfigError, match="imports 'absent_dependency_xyz', which is not inst"):
        load(factory="needs_absent:Net")
    with pytest.raises(ConfigError, match="has no 'ResNet'.*TinyResNet"):
        load(factory=f"{MODULE}:ResNet")
    with pytest.raises(ConfigError, match=r"stem.0.weight: file \(8, 3, 3, 3\), model"):
        load(
            factory=f"{MODULE}:TinyResNet", kwargs={"width": 4}, path=own.folder / "lightning.ckpt"
        )
    with pytest.raises(ValueError, match="package.module:callable"):
        ModelSpec(**_model(own, source="python", factory="no_colon"))


def test_wider_net_mismatch_is_named_layer_by_layer(own):
    from aisafety.prediction.state_dict import load_into

    state = own.net.state_dict()
    with pytest.raises(ConfigError) as caught:
        load_into(own.module.TinyResNet(width=4), state, "m", "file.pt")
    message = str(caught.value)
    assert "width differs: the file's stem.0.weight has 8 channels, the model's 4" in message
    assert "stem.0.weight: file (8, 3, 3, 3), model (4, 3, 3, 3)" in message
    assert "(and 14 more)" in message  # the 17th, fc.weight (10, 8) vs (10, 4), is counted


# --- plugin-registered architecture and model entry -----------------------------------------


def _lab_plugin(own):
    plugin = types.SimpleNamespace()

    @hookimpl
    def aisafety_architectures():
        return [
            Architecture(
                "tiny-resnet",
                own.module.TinyResNet,
                (3, 32, 32),
                10,
                mean=MEAN,
                std=STD,
                description="a CIFAR-shaped ResNet of the lab",
            )  # fmt: skip
        ]

    @hookimpl
    def aisafety_models():
        spec = ModelSpec(
            source="checkpoint", architecture="tiny-resnet", path=own.folder / "lightning.ckpt"
        )
        return [ModelEntry("lab-tiny-resnet", spec, "the lab's checkpoint")]

    plugin.aisafety_architectures = aisafety_architectures
    plugin.aisafety_models = aisafety_models
    return plugin


def test_plugin_architecture_with_a_lightning_state_dict(own, tmp_path):
    registry = build_registry(extra_plugins=[("lab", _lab_plugin(own))])
    assert registry.sources["architecture"]["tiny-resnet"] == "lab"
    assert registry.sources["architecture"]["mnist-cnn"] == "aisafety.builtin"
    spec = ModelSpec(
        name="tiny", source="checkpoint", architecture="tiny-resnet",
        path=own.folder / "lightning.ckpt",
    )  # fmt: skip
    predictor, _ = load_model(spec, torch.device("cpu"), registry)
    assert predictor.input_shape == (3, 32, 32)  # from the record
    _same_logits(predictor, own, "plugin architecture + Lightning checkpoint")
    plan = EvaluationPlan.model_validate({**PLAN, "model": spec.model_dump()})
    db = f"sqlite:///{tmp_path / 'r.db'}"
    Runner(plan, ResultStore(db), registry=registry, quiet=True).run()
    _assert_stored(db)
    # an ImageNet user's 'resnet50' (session 21) is answered with source: python's factory
    with pytest.raises(UnknownNameError, match="known architectures: .*tiny-resnet.*use source: "
                       "python with its factory .*'torchvision.models:resnet50'"):  # fmt: skip
        load_model(spec.model_copy(update={"architecture": "tiny"}), torch.device("cpu"), registry)


def test_plugin_model_entry_loads_by_name(own):
    registry = build_registry(extra_plugins=[("lab", _lab_plugin(own))])
    predictor, _ = load_model(ModelSpec(name="lab-tiny-resnet"), torch.device("cpu"), registry)
    assert predictor.name == "lab-tiny-resnet"
    _same_logits(predictor, own, "plugin model entry")
    with pytest.raises(UnknownNameError, match="lab-tiny-resnet"):
        load_model(ModelSpec(name="lab-tiny"), torch.device("cpu"), registry)


def test_a_bad_architecture_record_is_a_plugin_failure(own):
    bad = types.SimpleNamespace(aisafety_architectures=hookimpl(lambda: ["tiny-resnet"]))
    invalid = types.SimpleNamespace(
        aisafety_architectures=hookimpl(lambda: [Architecture("x", int, (3, 32), 10)])
    )
    registry = build_registry(extra_plugins=[("bad", bad), ("invalid", invalid)])
    first, second = registry.failures
    assert "returned 'tiny-resnet'" in first.error and "Architecture records" in first.error
    assert "input_shape is (C, H, W), got (3, 32)" in second.error
    assert "mnist-cnn" in registry.names("architecture")


def test_checkpoint_naming_a_factory_points_at_source_python(own):
    spec = ModelSpec(name="m", source="checkpoint", architecture="mymodule:TinyResNet",
                     path=own.folder / "dataparallel.pt")  # fmt: skip
    with pytest.raises(UnknownNameError, match="use source: python with factory"):
        load_model(spec, torch.device("cpu"))


# --- source: export --------------------------------------------------------------------------


def test_export_archive(own, tmp_path):
    model = _model(own, source="export", path="net.pt2", mean=list(MEAN), std=list(STD))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(_plan_file(own, "export", model)), "--db", db, "--quiet"]) == 0
    _assert_stored(db)
    spec = ModelSpec.model_validate({**model, "path": own.folder / "net.pt2"})
    predictor, _ = load_model(spec, torch.device("cpu"))
    _same_logits(predictor, own, "torch.export .pt2")
    assert "block.conv1" in predictor.layer_names()


def test_export_graph_bounds_hold_on_sampled_points(own):
    """CROWN on the ATen graph of the .pt2 (conv2d, batch_norm, add, adaptive_avg_pool2d,
    linear): every sampled point of the box lies within the output bounds."""
    spec = ModelSpec(**_model(own, source="export", path=own.folder / "net.pt2",
                              mean=MEAN, std=STD))  # fmt: skip
    predictor, _ = load_model(spec, torch.device("cpu"))
    graph = build_graph(predictor.bound_network, predictor.input_shape, "net.pt2")
    assert {"conv", "elementwise", "add", "positive-linear", "dense"} <= {o.kind for o in graph.ops}
    x = own.x[:1].double()
    eps = 2 / 255
    lower, upper = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
    low, high = bounds.linear_boxes(graph, lower, upper)[-1]
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        u = torch.rand(x.shape, generator=generator, dtype=torch.float64)
        point = lower + u * (upper - lower)
        with torch.no_grad():
            out = graph.forward(point)
            net = predictor.logits(point.float()).double()
        assert (out >= low - 1e-9).all() and (out <= high + 1e-9).all()
        assert (net >= low - 1e-4).all() and (net <= high + 1e-4).all()


def test_export_with_a_fixed_batch_runs_in_chunks_and_says_why_it_cannot_be_bounded(own):
    spec = ModelSpec(**_model(own, source="export", path=own.folder / "net-batch1.pt2",
                              mean=MEAN, std=STD))  # fmt: skip
    predictor, _ = load_model(spec, torch.device("cpu"))
    _same_logits(predictor, own, "torch.export .pt2 with batch 1")
    features = predictor.features(own.x, ["block.conv1"])
    assert features["block.conv1"].shape == (N, 8, 16, 16)
    plan = EvaluationPlan.model_validate({**PLAN, "model": spec.model_dump()})
    with pytest.raises(CapabilityError, match="fixed batch size of 1.*dynamic"):
        Runner(plan, ResultStore("sqlite://"), quiet=True).prepare()


# --- TorchScript ----------------------------------------------------------------------------


def test_torchscript_runs_attacks_and_names_the_sources_for_the_rest(own, tmp_path):
    model = _model(own, source="torchscript", path="net.ts", mean=list(MEAN), std=list(STD))
    plan = {**PLAN, "metrics": [{"name": "ca"}, {"name": "robust-accuracy"}]}
    db = f"sqlite:///{tmp_path / 'r.db'}"
    path = _plan_file(own, "torchscript", model, metrics=plan["metrics"])
    assert main(["evaluate", str(path), "--db", db, "--quiet"]) == 0
    assert {"ca", "robust-accuracy"} <= set(_stored(db))
    spec = ModelSpec.model_validate({**model, "path": own.folder / "net.ts"})
    predictor, _ = load_model(spec, torch.device("cpu"))
    _same_logits(predictor, own, "TorchScript")
    expected = {
        "tkncov": "activations.*cannot be hooked.*source: python.*source: export",
        "rdi": "activations.*cannot be hooked.*source: python.*source: export",
        "certified-accuracy": "bound graph.*cannot be bounded.*source: python, export or onnx",
    }
    for metric, message in expected.items():
        one = EvaluationPlan.model_validate(
            {**PLAN, "model": spec.model_dump(), "metrics": [{"name": metric}]}
        )
        with pytest.raises(CapabilityError, match=message):
            Runner(one, ResultStore("sqlite://"), quiet=True).prepare()


def test_torchscript_modules_cannot_be_hooked(own):
    """Why TorchScript offers no activations (torch 2.13): a loaded archive refuses forward
    hooks, and a traced module's hooks never fire."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        loaded = torch.jit.load(str(own.folder / "net.ts"))
        traced = torch.jit.trace(own.net, own.x[:2])
    with pytest.raises(RuntimeError, match="not supported on ScriptModules"):
        loaded.block.conv1.register_forward_hook(lambda *_: None)
    fired = []
    traced.block.conv1.register_forward_hook(lambda *_: fired.append(1))
    traced(own.x[:2])
    assert fired == []


# --- the Python API ------------------------------------------------------------------------


def test_python_api_with_a_module_and_arrays(own, tmp_path):
    data = EmbeddedCifar10().load(None, "test")
    images = (data.x[:N] * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()  # NHWC
    labels = data.y[:N].numpy()
    db = f"sqlite:///{tmp_path / 'r.db'}"
    plan = {key: value for key, value in PLAN.items() if key != "profile_dataset"}
    record = aisafety.evaluate(
        plan, db, model=own.net, data=(images, labels), name="tiny-resnet", mean=MEAN, std=STD
    )
    _assert_stored(db)
    assert record.plan.model.source == "object" and record.plan.model.name == "tiny-resnet"
    from aisafety.loading import fingerprint

    _, rows = ResultStore(db).query("SELECT fingerprint FROM datasets WHERE name = 'arrays'")
    assert rows == [(fingerprint(data.take(list(range(N)))),)]  # the very images handed in
    again = aisafety.evaluate(
        plan, db, resume=True, model=own.net, data=(images, labels), name="tiny-resnet",
        mean=MEAN, std=STD,
    )  # fmt: skip
    assert again.resumed_units > 0  # the same model and images: the same units, resumed

    def dumped(run):
        return sorted(json.dumps([v.metric, v.attack, v.eps, v.value]) for v in run.values)

    assert dumped(again) == dumped(record)
    other = own.module.TinyResNet()
    # A module without data= was refused ("give data= too") whatever dataset the plan named;
    # since session 21 it runs on the plan's dataset, whose images give its input shape.
    # Its clean accuracy is the module's own on those images (the reference).
    on_plan = aisafety.evaluate({"dataset": PLAN["dataset"], "metrics": ["ca"]}, db, model=other)
    from aisafety.loading import load_data
    from aisafety.plugins import default_registry

    plans = load_data(on_plan.plan.dataset, default_registry())
    with torch.no_grad():
        right = (other.eval()(plans.x).argmax(1) == plans.y).float().mean().item()
    assert on_plan.plan.dataset.name == "cifar10-embedded" and len(plans) == N
    assert on_plan.plan.model.source == "object" and on_plan.values[0].value == right
    from aisafety.in_memory import in_memory_model

    (predictor, mine), spec = in_memory_model(own.net, (3, 32, 32), mean=MEAN, std=STD)
    _same_logits(predictor, own, "aisafety.evaluate(model=nn.Module)")
    assert spec.num_classes == 10 and spec.input_shape == (3, 32, 32)
    (_, theirs), _ = in_memory_model(other, (3, 32, 32), mean=MEAN, std=STD)
    assert mine != theirs  # other weights, another fingerprint


def test_a_stored_object_model_cannot_be_loaded_from_a_plan():
    spec = ModelSpec(name="net", source="object", input_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(ConfigError, match=r"aisafety.evaluate\(model=...\).*source: python"):
        load_model(spec, torch.device("cpu"))


def test_list_architectures_shows_the_zoos_through_the_hook():
    from aisafety.listing import list_entries
    from aisafety.plugins import default_registry

    entries, _ = list_entries("architectures", default_registry())
    cnn = next(e for e in entries if e["name"] == "mnist-cnn")
    assert cnn["input_shape"] == [1, 28, 28] and cnn["num_classes"] == 10
    assert cnn["plugin"] == "aisafety.builtin" and cnn["description"]
