"""A model file this user may not read (mode 000, a folder without permission) was a
``PermissionError`` traceback from every file source; it is one error naming the file."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from aisafety.errors import ConfigError
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model

SOURCES = {
    "python": {"factory": "torch.nn:Flatten", "input_shape": (1, 28, 28)},
    "checkpoint": {"architecture": "mnist-cnn"},
    "export": {"input_shape": (1, 28, 28)},
    "torchscript": {"input_shape": (1, 28, 28)},
    "onnx": {},
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_an_unreadable_model_file_is_named_with_the_reason(source, tmp_path, monkeypatch):
    file = tmp_path / "model.bin"
    file.write_bytes(b"weights")
    read_bytes = Path.read_bytes

    def denied(path: Path) -> bytes:  # root reads a mode-000 file: refuse as a user's OS would
        if path == file:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    spec = ModelSpec(name="m", source=source, path=file, **SOURCES[source])
    with pytest.raises(ConfigError) as error:
        load_model(spec, torch.device("cpu"))
    assert f"{file}' cannot be read: Permission denied; check its permissions" in str(error.value)
