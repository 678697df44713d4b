"""The tracebacks left after Reliability II (issue #35, finding 6): each a user's mistake,
each now a clear error with exit 2 naming the thing and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from aisafety.cli import main


class _Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 0:
            raise ValueError("boom")
        return x


class _Tuple(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.flatten(1)[:, :10], x


class _Int64(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.flatten(1)[:, :10] * 10).long()


def _evaluate(tmp_path, capsys, plan: str) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(plan + "metrics: [ca]\ndevice: cpu\n")
    assert main(["evaluate", str(path), "--db", f"sqlite:///{tmp_path / 'r.db'}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "module, message",
    [(_Raises(), "does not run on input_shape (1, 28, 28) (builtins.ValueError: boom)"),
     (_Tuple(), "returned scores of shape <class 'tuple'> for 8 input(s)"),
     (_Int64(), "returned scores of dtype torch.int64; expected floating-point scores")],
)  # fmt: skip
def test_a_torchscript_model_that_misbehaves_is_named(module, message, tmp_path, capsys):
    torch.jit.save(torch.jit.script(module), tmp_path / "m.pt")
    err = _evaluate(tmp_path, capsys, (
        f"model: {{name: scripted, source: torchscript, path: {tmp_path / 'm.pt'}, "
        "input_shape: [1, 28, 28], num_classes: 10}\ndataset: {limit: 8}\n"
    ))  # fmt: skip
    assert f"model 'scripted' {message}" in err


def test_an_empty_npz_dataset_is_named(tmp_path, capsys):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 1, 28, 28), np.float32), y=np.zeros(0, int))
    err = _evaluate(tmp_path, capsys, f"dataset: {{name: npz, path: {tmp_path / 'empty.npz'}}}\n")
    assert "dataset 'npz' (test split at" in err and "holds no samples" in err


def test_a_database_folder_that_cannot_be_made_is_named(capsys):
    assert main(["evaluate", "--db", "sqlite:////proc/x/y.db", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot create the folder of the results database '/proc/x/y.db'" in err
    assert "Traceback" not in err


def test_a_junk_onnx_file_is_named(tmp_path, capsys):
    """onnx.load_from_string (reading external weights) raised protobuf's DecodeError."""
    pytest.importorskip("onnx", reason="onnx is not installed: pip install 'aisafety[onnx]'")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x01junk")
    err = _evaluate(tmp_path, capsys, f"model: {{name: j, source: onnx, path: {junk}}}\n")
    assert f"model 'j': '{junk}' is not an ONNX model (DecodeError" in err
    assert "export one with torch.onnx.export" in err


ALLOCATOR_ERRORS = {
    # what torch 2.13 raised for nn.Linear(784, 100_000_000) on this machine (313.6 GB)
    "cpu": RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 313600000000 bytes. Error code 12 (Cannot allocate memory)"
    ),
    "cuda": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 160.00 GiB"),
}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_model_factory_asking_for_too_much_memory_is_named(device, tmp_path, capsys):
    """Raised rather than allocated: where the kernel overcommits, a real 313 GB module
    would be allocated and then written page by page until the OOM killer came."""
    factory = tmp_path / f"huge_{device}.py"  # a module name per case: imports are cached
    factory.write_text(
        "from test_left_tracebacks import ALLOCATOR_ERRORS\n\n"
        f"def huge():\n    raise ALLOCATOR_ERRORS[{device!r}]\n"
    )
    tests = str(Path(__file__).parent)
    err = _evaluate(tmp_path, capsys, (
        f"model: {{name: huge, source: python, factory: 'huge_{device}:huge', python_path: "
        f"[{tmp_path}, {tests}], input_shape: [1, 28, 28], num_classes: 10}}\n"
    ))  # fmt: skip
    assert f"model 'huge': factory 'huge_{device}:huge'(**{{}}) ran out of memory building" in err
    assert ("313600000000 bytes" if device == "cpu" else "160.00 GiB") in err
    assert "check the sizes its settings ask for" in err
