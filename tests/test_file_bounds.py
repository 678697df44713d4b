"""Files from outside are checked by stat before they are opened (issue #35, findings 3, 4
and 9): a FIFO, a device or a folder gets its own message instead of "does not exist" (or
a hang), and a huge plan is refused before a byte is read (aisafety/files.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

from aisafety.cli import main
from aisafety.config import MAX_PLAN_BYTES, load_plan
from aisafety.errors import ConfigError
from aisafety.interfaces import DatasetSpec, ModelSpec
from aisafety.loading import load_data, load_model
from aisafety.plugins import default_registry

LIMIT_S = 10.0  # an open() on a FIFO blocks forever: anything that returns is a pass


def _within(call, limit_s: float = LIMIT_S) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised, or fail if it is still running."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert outcome, f"still running after {limit_s} s (blocked on a special file?)"
    return outcome[0]


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "plan.yaml"
    os.mkfifo(path)
    return path


def _loaders(path: Path):
    device = torch.device("cpu")
    checkpoint = ModelSpec(
        name="m", source="checkpoint", path=path, architecture="mnist-cnn",
        input_shape=(1, 28, 28), num_classes=10,
    )  # fmt: skip
    return {
        "plan": (lambda: load_plan(path), "config file"),
        "checkpoint": (lambda: load_model(checkpoint, device), "model 'm': file"),
        "torchscript": (
            lambda: load_model(
                ModelSpec(name="t", source="torchscript", path=path, input_shape=(1, 28, 28)),
                device,
            ),  # fmt: skip
            "model 't': file",
        ),
        "npz": (
            lambda: load_data(DatasetSpec(name="npz", path=path), default_registry()),
            "dataset 'npz': file",
        ),
    }


@pytest.mark.parametrize("reader", ["plan", "checkpoint", "torchscript", "npz"])
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_special_files_are_refused_up_front(reader, kind, tmp_path):
    path = {
        "fifo": tmp_path / "x.yaml",
        "device": Path("/dev/zero"),
        "folder": tmp_path / "d.yaml",
    }[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    call, what = _loaders(path)[reader]
    error = _within(call)
    assert isinstance(error, ConfigError), error
    expected = {"fifo": "is a FIFO (named pipe)", "device": "is a character device",
                "folder": "is a folder"}[kind]  # fmt: skip
    if reader == "npz" and kind == "folder":  # a folder of split files is an npz dataset
        assert "is a folder without test.npz" in str(error)
        return
    assert f"{what} {str(path)!r} {expected}, not a regular file" in str(error)
    assert "does not exist" not in str(error)


def test_evaluate_names_a_fifo_plan_and_exits_2(fifo, capsys):
    codes: list[int] = []
    assert _within(lambda: codes.append(main(["evaluate", str(fifo)]))) is None
    assert codes == [2]
    assert "is a FIFO (named pipe), not a regular file" in capsys.readouterr().err


def test_a_huge_plan_is_refused_by_its_size_before_reading(tmp_path, monkeypatch):
    plan = tmp_path / "huge.yaml"
    with plan.open("wb") as handle:
        handle.truncate(2 << 30)  # sparse: 2 GiB without writing them
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"read {self}"))
    start = time.monotonic()
    with pytest.raises(
        ConfigError, match=f"is 2,147,483,648 bytes, above the limit of {MAX_PLAN_BYTES:,}"
    ):
        load_plan(plan)
    assert time.monotonic() - start < LIMIT_S


def test_a_missing_file_still_says_so(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_plan(tmp_path / "typo.yaml")
