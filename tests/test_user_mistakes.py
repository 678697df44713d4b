"""A user's first hour with their own CIFAR-10 model: each usual mistake is one message that
names the thing, the value and the fix, never a traceback (session 11's walk)."""

from __future__ import annotations

import io
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import aisafety
from aisafety.errors import ConfigError, InputError, ModelOutputError
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model
from aisafety.prediction.state_dict import load_into, read_state_dict
from aisafety.prediction.torch_module import TorchPredictor

PLAN = {"dataset": {"limit": 2}, "metrics": ["ca"]}


class Extra(nn.Module):
    """Logits plus something else, as training code with an auxiliary loss returns them."""

    def __init__(self, as_dict: bool):
        super().__init__()
        self.as_dict = as_dict
        self.fc = nn.Linear(3 * 4 * 4, 10)

    def forward(self, x):
        logits = self.fc(x.flatten(1))
        return {"logits": logits, "aux": x.mean()} if self.as_dict else (logits, x.mean())


def extra(as_dict: bool = False) -> Extra:
    return Extra(as_dict)


def _images(n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    return np.random.default_rng(0).random((n, 3, 4, 4), dtype=np.float32), np.zeros(n, int)


@pytest.mark.parametrize(
    "as_dict, returns, fix",
    [
        (False, "a tuple (0: tensor (1, 10), 1: tensor ())", "returns net(x)[0]"),
        (True, "a dict ('logits': tensor (1, 10), 'aux': tensor ())", "returns net(x)['logits']"),
    ],
)
def test_a_module_returning_more_than_logits_is_named_with_the_element_to_return(
    tmp_path, as_dict, returns, fix
):
    with pytest.raises(ConfigError) as caught:  # was AttributeError: 'tuple' has no 'dim'
        aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model=Extra(as_dict), data=_images())
    assert returns in str(caught.value) and fix in str(caught.value)
    spec = ModelSpec(
        name="m", source="python", factory=f"{__name__}:extra", kwargs={"as_dict": as_dict},
        input_shape=(3, 4, 4),
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_model(spec, torch.device("cpu"))
    assert returns in str(caught.value) and fix in str(caught.value)


def _saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_a_training_scripts_checkpoint_loads_its_one_dict_of_tensors():
    net = nn.Linear(4, 3)
    saved = {"net": net.state_dict(), "acc": 93.1, "epoch": 199, "optimizer": {"state": {}}}
    state = read_state_dict(_saved(saved), "m", "ckpt.pth")  # kuangliu/pytorch-cifar's form
    other = nn.Linear(4, 3)
    load_into(other, state, "m", "ckpt.pth")  # was: missing weight, bias; left over net, acc
    assert torch.equal(other.weight, net.weight) and torch.equal(other.bias, net.bias)


def test_a_checkpoint_with_two_state_dicts_names_both_and_the_fix():
    saved = {"model": nn.Linear(4, 3).state_dict(), "model_ema": nn.Linear(4, 3).state_dict()}
    with pytest.raises(ConfigError, match=r"several state dicts \('model', 'model_ema'\).*"):
        read_state_dict(_saved(saved), "m", "ckpt.pth")


def test_a_whole_pickled_module_is_refused_with_the_line_that_saves_its_weights():
    with pytest.raises(ConfigError) as caught:
        read_state_dict(_saved(nn.Linear(4, 3)), "m", "whole.pt")
    message = str(caught.value)  # was torch's text cut after "you have two options,"
    assert "(torch.nn.modules.linear.Linear: a whole module saved by torch.save(model)" in message
    assert ".state_dict(), 'weights.pt')" in message
    assert "\x1b" not in message


MEAN_255, STD_255 = (125.3, 123.0, 113.9), (63.0, 62.1, 66.7)


def test_a_mean_in_0_255_units_is_refused_with_the_values_in_0_1_units(tmp_path):
    """It ran silently at chance accuracy: every [0, 1] image became about -2 after (x - 125)."""
    with pytest.raises(ValueError) as caught:
        ModelSpec(name="m", source="onnx", path="m.onnx", mean=MEAN_255, std=STD_255)
    message = str(caught.value)
    assert "mean [125.3, 123.0, 113.9] exceeds 1" in message
    assert "mean [0.4914, 0.4824, 0.4467] and std [0.2471, 0.2435, 0.2616]" in message
    assert "add scale: 255" in message
    ModelSpec(name="m", source="onnx", path="m.onnx", mean=MEAN_255, std=STD_255, scale=255)
    with pytest.raises(ConfigError, match=r"evaluate\(mean=...\): mean \[125.3, 123.0, 113.9\]"):
        aisafety.evaluate(
            PLAN, f"sqlite:///{tmp_path}/a.db", model=extra(), data=_images(), mean=MEAN_255
        )


def test_a_channels_last_input_shape_is_named_with_layout_nhwc():
    """It said 'add a batch dimension or resize the images' to a (N, 32, 32, 3) ONNX graph."""
    predictor = TorchPredictor(nn.Flatten(), (4, 4, 3), 10, name="m")
    with pytest.raises(InputError) as caught:
        predictor.check_input_layout(torch.rand(2, 3, 4, 4))
    message = str(caught.value)
    assert "input_shape (4, 4, 3) is channels-last" in message and "layout: nhwc" in message
    assert "input_shape [3, 4, 4]" in message and "resize" not in message


def test_a_settings_typo_lists_the_valid_settings_with_their_defaults():
    """A default_factory field was listed as 'verifier_config=PydanticUndefined'."""
    from aisafety.plugins import default_registry

    with pytest.raises(ConfigError) as caught:
        default_registry().create("metric", "certified-accuracy", {"epsilon": 0.01})
    message = str(caught.value)
    assert "epsilon: Extra inputs are not permitted" in message
    assert "verifier_config={}, attack='pgd-linf', attack_config={}" in message
    assert "PydanticUndefined" not in message


def test_a_certified_eps_on_the_0_255_scale_is_refused_naming_its_0_1_value():
    """eps: 2 (meaning 2/255) ran: the box covered every image, certified-accuracy 0."""
    from aisafety.plugins import default_registry

    with pytest.raises(ConfigError) as caught:
        default_registry().create("metric", "certified-accuracy", {"eps": 2})
    message = str(caught.value)
    assert "eps=2 exceeds 1" in message and "on the 0-255 scale 2 is 0.007843" in message
    default_registry().create("metric", "certified-accuracy", {"eps": 1})


@pytest.mark.parametrize(
    "mean, std, fix",
    [(0.0, 1 / 255, "lie in 0..255, and images are in [0, 1]: divide 0..255 values by 255"),
     (0.5, 0.25, "lie in -2..2, and images are in [0, 1]: normalised images (a data loader's")],
)  # fmt: skip
def test_float_images_out_of_range_name_the_range_and_the_fix(tmp_path, mean, std, fix):
    """It said 'float images must lie in [0, 1]' with neither the range nor the likely cause."""
    x, y = _images()
    x[0, 0, 0, 0], x[1, 0, 0, 0] = 0.0, 1.0  # the range is exactly 0..1 before the mistake
    with pytest.raises(ConfigError, match=re.escape(fix)):
        aisafety.evaluate(
            PLAN, f"sqlite:///{tmp_path}/a.db", model=extra(), data=((x - mean) / std, y)
        )


def test_a_module_handed_in_mid_training_gets_its_modes_back(tmp_path):
    """It was evaluated in eval mode (right) and left there: further training went on
    without dropout and with frozen BatchNorm statistics."""
    net = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(48, 10)).train()
    net[2].eval()  # a frozen head: each submodule's own mode comes back
    net[2].bias.requires_grad_(False)  # and each parameter's requires_grad (session 21)
    before = [module.training for module in net.modules()]
    record = aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model=net, data=_images())
    assert [module.training for module in net.modules()] == before == [True, True, True, False]
    assert [p.requires_grad for p in net.parameters()] == [True, False]
    assert record.values


def test_a_model_file_given_as_model_points_at_the_plans_model_sources(tmp_path):
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model="net.onnx", data=_images())
    message = str(caught.value)  # it said only: got str
    assert "got str 'net.onnx'; a model file is named in the plan" in message
    assert "source: onnx, export, torchscript or python" in message


def test_labels_beyond_the_models_classes_are_refused_before_any_work(tmp_path):
    """Labels 1..10 for a 10-class model ran with ca alone (a label 10 never predicted)."""
    x, _ = _images(4)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 10))
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(
            {"metrics": ["ca"]},
            f"sqlite:///{tmp_path}/a.db",
            model=net,
            data=(x, np.array([1, 2, 10, 3])),
        )
    message = str(caught.value)
    assert "has labels 1..10, but model 'Sequential' has 10 classes, labels 0..9" in message
    assert "numbered from 1? give y - 1" in message


@pytest.mark.parametrize("sampling", ["balanced", "uniform"])
def test_labels_beyond_the_models_classes_are_refused_when_the_limit_samples_none(
    tmp_path, sampling
):
    """The check ran on the plan's subset: labels 1..10 with ``limit: 2`` sampled 1 and 2,
    and ca was stored (0.0 on a model whose every prediction was one off)."""
    x, _ = _images(4)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 10))
    y = np.array([1, 2, 10, 3]) if sampling == "balanced" else np.array([10, 1, 1, 1])
    plan = {"dataset": {"limit": 1, "sampling": sampling}, "metrics": ["ca"]}
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(plan, f"sqlite:///{tmp_path}/a.db", model=net, data=(x, y))
    assert "has labels 1..10, but model 'Sequential' has 10 classes" in str(caught.value)


def test_a_module_that_does_not_run_on_the_images_handed_in_is_named_not_a_traceback(tmp_path):
    """An MNIST-shaped module given CIFAR images: torch's RuntimeError reached the user
    from aisafety.evaluate (the plan route already named the model and input_shape)."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model=net, data=_images())
    message = str(caught.value)
    head = "model 'Sequential' does not run on input_shape (3, 4, 4) (RuntimeError: mat1 and mat2"
    assert head in message
    assert "the shape of one image of data=" in message


def test_one_hot_labels_are_told_to_take_the_argmax(tmp_path):
    """(N, 10) one-hot labels, as a Keras pipeline holds them, were told only "give N
    integer labels 0..K-1"; the fix named is the one that works."""
    x, y = _images(2)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 10))
    one_hot = np.eye(10)[y]
    with pytest.raises(ConfigError, match=r"float64 \(2, 10\); give 2 integer labels 0..K-1 "
                       r"\(one-hot rows\? give y.argmax\(1\)\)"):  # fmt: skip
        aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model=net, data=(x, one_hot))
    record = aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model=net,
                               data=(x, one_hot.argmax(1)))  # fmt: skip
    assert record.values[0].metric == "ca"


class _ChannelsLast(nn.Module):
    """A network written for (N, H, W, C) batches, as a Keras port or an NHWC ONNX graph."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.permute(0, 3, 1, 2)).flatten(1)


class _Permuted(nn.Module):
    """The wrapper the message names: NCHW in, the channels-last network inside."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 2, 3, 1))


def test_a_channels_last_module_is_told_to_permute_not_to_reshape_its_images(tmp_path):
    """The images were right (4x4x3, NHWC) and the message said "give images of the shape
    the model was trained on"; every module is fed NCHW, so it names the wrapper that
    works, checked here to run."""
    x, y = np.random.default_rng(0).integers(0, 256, (4, 4, 4, 3), dtype=np.uint8), np.zeros(4)
    db, net = f"sqlite:///{tmp_path}/a.db", _ChannelsLast()
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(PLAN, db, model=net, data=(x, y.astype(np.int64)))
    assert "its forward runs net(x.permute(0, 2, 3, 1))" in str(caught.value)
    record = aisafety.evaluate(PLAN, db, model=_Permuted(net), data=(x, y.astype(np.int64)))
    assert record.values[0].metric == "ca"


def test_a_state_dict_given_as_an_export_archive_is_named_without_torchs_log(tmp_path, capfd):
    """torch.export.load logged a 20-line traceback to stderr, then the error said
    "Please check the warnings above"; a torch.save file was not named as one."""
    from aisafety.prediction.exported import load_exported

    path = tmp_path / "weights.pt"
    torch.save(nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(ConfigError) as caught:
        load_exported(path.read_bytes(), "m")
    message = str(caught.value)
    assert "(PytorchStreamReader failed locating file archive_format: file not found)" in message
    assert "it is a torch.save file (a state dict?)" in message
    assert "warnings above" not in message and "miniz" not in message
    assert "Traceback" not in capfd.readouterr().err


def _saved(checkpoint: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def test_a_checkpoint_with_a_model_and_its_ema_copy_is_not_guessed_under_state_dict():
    """timm's checkpoint (``state_dict`` and ``state_dict_ema``): ``state_dict`` was taken
    without a word, though the docs say two candidates are named, not guessed."""
    net, ema = nn.Linear(3, 2), nn.Linear(3, 2)
    optimiser = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.ones(1, 3)).sum().backward()
    optimiser.step()
    timm = {"epoch": 3, "state_dict": net.state_dict(), "optimizer": optimiser.state_dict()}
    state = read_state_dict(_saved(timm), "m", "last.pth.tar")  # one candidate: taken
    assert torch.equal(state["weight"], net.weight)
    timm["state_dict_ema"] = ema.state_dict()
    with pytest.raises(ConfigError) as caught:
        read_state_dict(_saved(timm), "m", "last.pth.tar")
    assert "holds several state dicts ('state_dict', 'state_dict_ema')" in str(caught.value)


def test_a_predictor_built_in_python_refuses_a_mean_in_0_255_units(tmp_path):
    """The plan and evaluate(mean=...) refused it; TorchPredictor(mean=...) and the
    ONNX Runtime predictor took it and the accuracy sat at chance without a word."""
    from aisafety.prediction.onnx_model import load_onnx

    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 10))
    with pytest.raises(ConfigError, match=r"normalisation: mean \[125.3, 123.0, 113.9\] exceeds"):
        TorchPredictor(net, (3, 4, 4), 10, mean=MEAN_255, std=STD_255)
    torch.onnx.export(net, (torch.zeros(1, 3, 4, 4),), str(tmp_path / "m.onnx"), dynamo=False)
    with pytest.raises(ConfigError, match=r"normalisation: mean \[125.3"):
        load_onnx(str(tmp_path / "m.onnx"), mean=MEAN_255, std=STD_255)
    TorchPredictor(net, (3, 4, 4), 10, mean=(1.0, 0.5, 0.0), std=STD_255)  # [0, 1]: taken


def test_an_export_archive_with_a_fixed_batch_above_one_loads_and_runs_in_chunks(tmp_path):
    """Exported with a batch of 3 (its example batch, no dynamic_shapes): the classes were
    probed with one image, and loading failed with "does not run on input_shape (3, 4, 4)
    (Guard failed: input.size()[0] == 3); check input_shape", an input_shape that was right."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 10)).eval()
    torch.export.save(torch.export.export(net, (torch.rand(3, 3, 4, 4),)), tmp_path / "n.pt2")
    spec = ModelSpec(name="n", source="export", path=tmp_path / "n.pt2", input_shape=(3, 4, 4))
    predictor, _ = load_model(spec, torch.device("cpu"))
    assert predictor.num_classes == 10
    x = torch.rand(5, 3, 4, 4)  # a chunk of 3 and a padded one of 2
    assert torch.allclose(predictor.logits(x), net(x), atol=1e-6)


def five_classes() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 5))


def test_a_plan_datasets_labels_are_checked_before_its_limit(tmp_path):
    """A 5-class model on the embedded CIFAR-10 images with ``limit: 4`` (labels 0..3
    sampled) stored ca for a model that can never predict classes 5..9."""
    model = {"name": "five", "source": "python", "factory": f"{__name__}:five_classes"}
    plan = {
        "model": {**model, "input_shape": [3, 32, 32]},
        "dataset": {"name": "cifar10-embedded", "limit": 4},
        "metrics": ["ca"],
    }
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(plan, f"sqlite:///{tmp_path}/a.db")
    assert "has labels 0..9, but model 'five' has 5 classes" in str(caught.value)


def _deep(width: int, classes: int = 10) -> nn.Sequential:
    """ResNet-18's shape of problem: 20 conv + BatchNorm layers, each as wide as ``width``."""
    layers = [nn.Conv2d(3, width, 3), nn.BatchNorm2d(width)]
    for _ in range(19):
        layers += [nn.Conv2d(width, width, 3), nn.BatchNorm2d(width)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(width, classes))


def test_a_narrower_nets_state_dict_names_the_width_and_a_few_layers_not_every_one():
    """It was one 7 KB line listing every layer of a narrower ResNet-18."""
    with pytest.raises(ConfigError) as caught:
        load_into(_deep(64), _deep(32).state_dict(), "m", "r18.pt")
    message = str(caught.value)
    assert "width differs: the file's 0.weight has 32 channels, the model's 64" in message
    assert "0.weight: file (32, 3, 3, 3), model (64, 3, 3, 3)" in message
    assert "(and 118 more)" in message and "40.weight" not in message
    assert len(message) < 700


def test_a_state_dict_for_other_classes_names_the_classes():
    with pytest.raises(ConfigError) as caught:
        load_into(_deep(8), _deep(8, classes=100).state_dict(), "m", "r18.pt")
    message = str(caught.value)
    assert "classes differ: the file's 41.weight has 100 outputs, the model's 10" in message
    assert "41.bias: file (100,), model (10,)" in message


def test_a_certified_metrics_label_names_the_verifier_with_its_settings_as_attacks_are():
    """The label carried the settings' dict repr: ``verifier_config={'clock': 'cpu', ...}``."""
    from aisafety.plugins import default_registry
    from aisafety.report.sections import _without_radius

    def label(**config) -> str:
        return default_registry().create("metric", "certified-accuracy", config).label()

    crown = label(eps=0.0002, verifier_config={"timeout": 60, "clock": "cpu"})
    assert crown == "certified-accuracy(eps=0.0002,verifier=crown(clock=cpu,timeout=60))"
    assert label(eps=0.0002, verifier_config={"timeout": 30}) != crown  # two rows stay apart
    assert label(eps=0.01, verifier="ibp", attack_config={"steps": 10}) == (
        "certified-accuracy(eps=0.01,verifier=ibp,attack=pgd-linf(steps=10))"
    )
    assert _without_radius(crown) == "certified-accuracy(verifier=crown(clock=cpu,timeout=60))"
    steps = label(eps=0.01, attack_config={"steps": 7})  # "steps=" holds "eps="
    assert _without_radius(steps) == "certified-accuracy(attack=pgd-linf(steps=7))"


def _tiny_onnx(path) -> None:
    """A 4-input, 3-output ONNX network (one Gemm), written with onnx's helper. Its bias
    makes class 0 the top one at the centre of ``_property``'s box, the class the property
    keeps (so the input-space check has nothing to warn about): logits 0.537, 0.104,
    -0.128 there."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed: pip install 'aisafety[onnx]'")
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    bias = np.array([0.5, 0.0, 0.0], np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def _property(path, inputs: int, outputs: int) -> str:
    """A box over ``inputs`` X_i and the atom Y_1 >= Y_0, declaring ``outputs`` Y_j."""
    lines = [f"(declare-const X_{i} Real)" for i in range(inputs)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(outputs)]
    lines += [f"(assert (>= X_{i} 0.0))\n(assert (<= X_{i} 0.1))" for i in range(inputs)]
    path.write_text("\n".join([*lines, "(assert (>= Y_1 Y_0))\n"]))
    return str(path)


def test_verify_refuses_a_property_written_for_another_network(tmp_path, capsys):
    """A property of a 10-class net beside a 3-output net of the same input size was
    verified (its atoms read the first outputs); other input counts got 'X_4 ... is not
    supported' or 'missing bounds'; the arguments swapped, onnxruntime's traceback."""
    from aisafety.cli import main

    net = str(tmp_path / "net.onnx")
    _tiny_onnx(net)
    own = _property(tmp_path / "own.vnnlib", 4, 3)
    assert main(["verify", net, own, "--verifier", "crown"]) == 0
    # unsat: Y_0 - Y_1 is linear, its minimum over the box 0.5 - 0.19995 (closed form, the
    # negative parts of 0.1 (W_0 - W_1)); CROWN on one Gemm is exact
    assert capsys.readouterr().out.splitlines()[0] == "unsat"
    for inputs, outputs, what in ((4, 10, "declares 10 outputs (Y_0 .. Y_9), but network "
                                   "'net.onnx' has 3"),
                                  (6, 3, "declares 6 inputs (X_0 .. X_5), but network "
                                   "'net.onnx' takes 4"),
                                  (2, 3, "declares 2 inputs")):  # fmt: skip
        other = _property(tmp_path / "other.vnnlib", inputs, outputs)
        assert main(["verify", net, other, "--verifier", "crown"]) == 2
        err = capsys.readouterr().err
        assert what in err and "written for another network" in err, err
        assert "instances.csv" in err and "Traceback" not in err
    assert main(["verify", own, net]) == 2
    err = capsys.readouterr().err
    assert "the network comes first" in err and f"aisafety verify {net} {own}" in err


class Raising(nn.Module):
    """A forward that raises what user code raises: not only torch's RuntimeError."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error
        self.fc = nn.Linear(48, 10)

    def forward(self, x):
        raise self.error


ERRORS = [
    (ValueError("too many values to unpack\nsecond line"), "ValueError: too many values to unpack"),
    (TypeError("forward() missing 1 required argument"), "TypeError: forward() missing 1"),
    (KeyError("logits"), "KeyError: 'logits'"),
]


@pytest.mark.parametrize("error, named", ERRORS)
def test_a_forward_raising_any_exception_in_the_class_probe_is_named(error, named, tmp_path):
    """probe_classes caught RuntimeError, IndexError and AssertionError only: a ValueError
    of the user's forward reached the user as a traceback."""
    with pytest.raises(ConfigError) as caught:
        aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model=Raising(error), data=_images())
    message = str(caught.value)
    assert f"model 'Raising' does not run on input_shape (3, 4, 4) ({named}" in message
    assert "second line" not in message and "the shape of one image of data=" in message


@pytest.mark.parametrize("error, named", ERRORS)
def test_a_forward_raising_in_the_clean_pass_is_named(error, named, tmp_path):
    """With num_classes given nothing probes the model: its first call is the run's clean
    pass, where the same exceptions were a traceback."""
    from aisafety.runner import Runner
    from aisafety.store.results import ResultStore

    predictor = TorchPredictor(Raising(error), (1, 28, 28), 10, name="raising")
    plan = aisafety.config.plan_from_dict({"device": "cpu", **PLAN}, "p")
    with pytest.raises(ModelOutputError) as caught:
        store = ResultStore(f"sqlite:///{tmp_path}/a.db")
        Runner(plan, store, quiet=True, model=(predictor, "raising")).run()
    message = str(caught.value)
    assert f"model 'raising' failed on a batch of shape (2, 1, 28, 28): {named}" in message


class BatchAsConstant(nn.Module):
    """Reads the batch size as a Python int: torch.jit.trace records it as a constant, so
    the archive runs only at the batch it was traced on."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(48, 10)

    def forward(self, x):
        return self.fc(x.reshape(int(x.shape[0]), -1))


def _traced(batch: int) -> tuple[nn.Module, torch.jit.ScriptModule]:
    torch.manual_seed(0)
    net = BatchAsConstant().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the constant, as intended
        traced = torch.jit.trace(net, torch.rand(batch, 3, 4, 4))
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    return net, buffer.getvalue()


@pytest.mark.parametrize("num_classes", [None, 10])
def test_a_torchscript_archive_traced_on_one_image_runs_image_by_image(num_classes):
    """Traced on one image (the usual example input), it failed on the run's first batch."""
    from aisafety.prediction.torchscript import TorchScriptPredictor

    net, archive = _traced(1)
    predictor = TorchScriptPredictor(archive, (3, 4, 4), num_classes, name="traced")
    assert (predictor.num_classes, predictor.batch) == (10, 1)
    for n in (1, 3, 4, 6, 9):
        x = torch.rand(n, 3, 4, 4)
        assert torch.allclose(predictor.logits(x), net(x), atol=1e-6)


def test_a_torchscript_archive_run_image_by_image_says_so_once(tmp_path):
    """The image-by-image fallback gives the right logits but one image per forward pass; it
    was silent (session 18), so a user could not tell why a run was slow, nor how to fix it."""
    from aisafety.errors import AISafetyWarning
    from aisafety.prediction.torchscript import TorchScriptPredictor

    path = tmp_path / "traced.ts"
    path.write_bytes(_traced(1)[1])
    with pytest.warns(AISafetyWarning) as caught:
        predictor = TorchScriptPredictor(path, (3, 4, 4), 10, name="traced")
    (message,) = [str(w.message) for w in caught]
    assert f"model 'traced': TorchScript archive {str(path)!r} runs on one image" in message
    assert "one image per forward pass" in message
    assert "torch.jit.script" in message and "dynamic batch" in message
    assert "torch.export" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: at load, not on every batch
        predictor.logits(torch.rand(3, 3, 4, 4))


def test_a_torchscript_archive_with_a_dynamic_batch_does_not_warn():
    """The warning is for the fallback only: a scripted module runs any batch at once."""
    from aisafety.prediction.torchscript import TorchScriptPredictor

    torch.manual_seed(0)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(BatchAsConstant().eval()), buffer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predictor = TorchScriptPredictor(buffer.getvalue(), (3, 4, 4), 10, name="scripted")
    assert predictor.batch is None


def test_a_torchscript_archive_traced_on_a_batch_above_one_says_what_to_do():
    """An archive does not record the batch it was traced on (its input is a bare Tensor):
    the size cannot be learnt, so the error says how to make one that runs at any size."""
    from aisafety.prediction.torchscript import TorchScriptPredictor

    _, archive = _traced(4)
    with pytest.raises(ConfigError) as caught:
        TorchScriptPredictor(archive, (3, 4, 4), 10, name="traced")
    message = str(caught.value)
    assert "model 'traced' does not run on input_shape (3, 4, 4) (RuntimeError: " in message
    assert "The following operation failed" not in message  # the cause, not torch's header
    assert "traced with torch.jit.trace on a batch of N > 1" in message
    assert "script it (torch.jit.script)" in message and "source: export" in message


class Attention(nn.Module):
    """A ViT's attention block in eval mode: PyTorch's fast path when autograd is off."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x):
        tokens = x.flatten(2).transpose(1, 2)  # (N, 2x2 pixels, 4 channels)
        return self.attention(tokens, tokens, tokens, need_weights=False)[0].mean(1)


def test_an_archive_traced_under_no_grad_is_refused_gradient_attacks_naming_the_fix():
    """A ViT traced under torch.no_grad() records the attention fast path, which has no
    derivative: its first gradient attack failed mid-run with 'derivative for
    aten::_native_multi_head_attention is not implemented' (session 21, an ImageNet user's
    audit). Its gradients are now declared absent, so such a plan is refused before any work
    with the fix; the same module traced with gradients on gives them."""
    from aisafety.errors import CapabilityError
    from aisafety.interfaces import Capability
    from aisafety.prediction.torchscript import TorchScriptPredictor

    module, x = Attention().eval(), torch.rand(2, 4, 2, 2)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace's deprecation
        fast = torch.jit.trace(Attention().eval(), x, check_trace=False)
    predictor = TorchScriptPredictor(fast, (4, 2, 2), name="vit")
    assert Capability.GRADIENTS not in predictor.capabilities
    with pytest.raises(CapabilityError, match=r"aten::_native_multi_head_attention.*no "
                       r"derivative.*no torch\.no_grad\(\) around torch\.jit\.trace"):  # fmt: skip
        predictor.require(Capability.GRADIENTS, "attack 'fgsm'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slow = TorchScriptPredictor(torch.jit.trace(module, x, check_trace=False), (4, 2, 2))
    images = x.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(slow.logits(images).sum(), images)
    assert Capability.GRADIENTS in slow.capabilities and bool(gradient.abs().sum() > 0)


def test_a_predictor_of_a_live_traced_module_leaves_the_callers_weights_trainable():
    """torch.jit.trace(net, x) shares net's parameters; TorchScriptPredictor froze them for
    good, so the notebook's next net(x).sum().backward() failed (session 21). They are now
    frozen only while the predictor records its graph: the input gradient is right (a linear
    net's is the sum of its weight rows) and reaches no weight."""
    from aisafety.prediction.torchscript import TorchScriptPredictor

    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace's deprecation
        predictor = TorchScriptPredictor(
            torch.jit.trace(net, torch.rand(2, 3, 2, 2), check_trace=False), (3, 2, 2)
        )
    images = torch.rand(2, 3, 2, 2, requires_grad=True)
    predictor.logits(images).sum().backward()
    expected = net[1].weight.detach().sum(0).reshape(3, 2, 2).expand(2, -1, -1, -1)
    assert torch.allclose(images.grad, expected)
    assert [p.requires_grad for p in net.parameters()] == [True, True]
    assert all(p.grad is None for p in net.parameters())
    net(images).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
