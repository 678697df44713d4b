"""The ONNX route brings gradients (onnx2torch without its dependencies) and keeps the
installed torch, and refusing a gradient attack on an onnxruntime model names `gradients: true`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from aisafety.attack.pgd import PGDLinf
from aisafety.errors import CapabilityError, ConfigError
from aisafety.prediction import onnx_model

ROOT = Path(__file__).resolve().parents[1]


def test_the_onnx_extra_has_no_path_to_torchvision():
    """onnx2torch requires torchvision, which pip resolves to a newer (CUDA) torch over a CPU
    one: the extra leaves it out, and the install command adds onnx2torch with --no-deps
    (.ci/install_routes.py resolves the route in a fresh venv on torch 2.13.0+cpu)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extras["onnx"]}
    assert {"onnxruntime", "onnx"} <= names
    assert not names & {"onnx2torch", "torchvision", "torch"}


@pytest.mark.parametrize(
    ("version", "cuda"), [("2.13.0+cpu", None), ("2.14.1", "13.0"), ("2.1.2", "12.1")]
)
def test_install_hint_keeps_any_installed_torch(monkeypatch, version, cuda):
    """The command installs onnx2torch without its dependencies and names no torch or
    torchvision, so it is the same for CPU and CUDA builds of any torch."""
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    command = onnx_model.install_command()
    assert "aisafety[onnx]" in command and "--no-deps 'onnx2torch==" in command
    assert "torchvision" not in command and "'torch" not in command


def test_a_missing_package_error_gives_that_command():
    with pytest.raises(ConfigError) as caught:
        onnx_model.import_optional("onnx2torch_is_not_installed", "onnx2torch")
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
