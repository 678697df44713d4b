"""The ONNX extra brings gradients (onnx2torch), its install hint keeps the installed torch,
and refusing a gradient attack on an onnxruntime model names `gradients: true`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from aisafety.attack.pgd import PGDLinf
from aisafety.errors import CapabilityError, ConfigError
from aisafety.prediction import onnx_model

ROOT = Path(__file__).resolve().parents[1]


def test_the_onnx_extra_brings_onnx2torch():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extras["onnx"]}
    assert {"onnxruntime", "onnx", "onnx2torch"} <= names


@pytest.mark.parametrize(
    ("version", "cuda", "expected", "cpu_index"),
    [
        ("2.13.0+cpu", None, "torchvision==0.28.*", True),
        ("2.14.1", "13.0", "torchvision==0.29.*", False),
        ("2.1.2", "12.1", "torchvision==0.16.*", False),
    ],
)
def test_install_hint_names_the_torchvision_of_the_installed_torch(
    monkeypatch, version, cuda, expected, cpu_index
):
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None)
    command = onnx_model.install_command()
    assert f"'{expected}'" in command and "aisafety[onnx]" in command
    assert ("https://download.pytorch.org/whl/cpu" in command) is cpu_index


def test_a_missing_package_error_gives_that_command():
    with pytest.raises(ConfigError) as caught:
        onnx_model._import("onnx2torch_is_not_installed", "onnx2torch")
    message = str(caught.value)
    assert "'onnx2torch'" in message and onnx_model.install_command() in message


def test_gradient_attack_refusal_names_gradients_true(tmp_path):
    pytest.importorskip("onnxruntime")
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)).eval()
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(network, (torch.zeros(1, 1, 4, 4),), str(path), dynamo=False,
                      input_names=["x"], dynamic_axes={"x": {0: "batch"}})  # fmt: skip
    runtime = onnx_model.load_onnx(path)
    x, y = torch.rand(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])
    with pytest.raises(CapabilityError) as caught:
        PGDLinf(steps=2)(runtime, x, y, 0.05)
    message = str(caught.value)
    assert "pgd-linf" in message and "tiny" in message
    assert "gradients: true" in message and "onnx2torch" in message
