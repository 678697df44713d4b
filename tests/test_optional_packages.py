"""A command that needs an optional package it cannot import names the package and the
command that installs it, exits 2 and prints no traceback (issue 36: `aisafety verify`
without onnxruntime ended in a two-part traceback)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from aisafety.cli import main
from tests.shared_data import PLACES, absent, located

ERAN = located("vnncomp2021_eran") or PLACES[0] / "vnncomp2021_eran"
NET = ERAN / "nets" / "mnist_relu_9_200.onnx"


def _spec() -> Path:
    specs = sorted((ERAN / "specs").rglob("*.vnnlib")) if ERAN.is_dir() else []
    if not NET.is_file() or not specs:
        pytest.skip(absent("vnncomp2021_eran"))
    return specs[0]


def _fails_cleanly(capsys, argv: list[str], package: str, install: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert repr(package) in err or package in err, err
    assert install in err, err


@pytest.mark.parametrize("package", ["onnxruntime", "onnx"])
def test_verify_without_an_onnx_package(monkeypatch, capsys, package):
    spec = _spec()
    monkeypatch.setitem(sys.modules, package, None)
    _fails_cleanly(capsys, ["verify", str(NET), str(spec), "--timeout", "5"], package,
                   "pip install 'aisafety[onnx]'")  # fmt: skip


def test_serve_without_onnxruntime(monkeypatch, capsys):
    _spec()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    _fails_cleanly(capsys, ["serve", str(NET), "--port", "0"], "onnxruntime",
                   "pip install 'aisafety[onnx]'")  # fmt: skip


def test_the_distributed_route_without_ray(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    argv = ["evaluate", "--executor", "ray", "--limit", "10", "--quiet",
            "--db", f"sqlite:///{tmp_path / 'r.db'}"]  # fmt: skip
    _fails_cleanly(capsys, argv, "Ray", 'pip install "aisafety[distributed]"')
