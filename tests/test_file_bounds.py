"""Files from outside are checked by stat before they are opened (issue #35, findings 3, 4
and 9): a FIFO, a device or a folder gets its own message instead of "does not exist" (or
a hang), and a huge plan is refused before a byte is read (aisafety/files.py)."""

from __future__ import annotations

import os
import struct
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from aisafety.cli import main
from aisafety.config import MAX_PLAN_BYTES, load_plan
from aisafety.errors import ConfigError
from aisafety.interfaces import DatasetSpec, ModelSpec
from aisafety.loading import load_data, load_model
from aisafety.plugins import default_registry

# an open() on a FIFO blocks forever: anything that returns is a pass (a hang guard,
# far beyond a loaded machine's slowest return)
LIMIT_S = 300.0


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
    # refused before reading: every way of opening it fails the test (not a time limit,
    # which a loaded machine can overrun and a quick read of 2 sparse GiB can meet)
    real_open = open

    def no_open(file, *args, **kwargs):
        if Path(file) == plan:
            pytest.fail(f"opened {file}")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"read {self}"))
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: pytest.fail(f"opened {self}"))
    monkeypatch.setattr("builtins.open", no_open)
    with pytest.raises(
        ConfigError, match=f"is 2,147,483,648 bytes, above the limit of {MAX_PLAN_BYTES:,}"
    ):
        load_plan(plan)


def test_a_missing_file_still_says_so(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_plan(tmp_path / "typo.yaml")


def _flip_first_tensor_byte(path: Path) -> None:
    """Flip the first byte of the archive's first tensor (``*/data/0``, stored uncompressed):
    the archive stays readable and torch loads it, with another weight."""
    with zipfile.ZipFile(path) as archive:
        member = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[member.header_offset + 26 :][:4])
    data[member.header_offset + 30 + name_length + extra_length] ^= 0xFF
    path.write_bytes(bytes(data))


def _mnist_cnn_files(tmp_path: Path) -> dict[str, Path]:
    from aisafety.database.zoo import load_zoo_model

    network = load_zoo_model("mnist-cnn").network
    files = {"torchscript": tmp_path / "net.ts", "checkpoint": tmp_path / "net.pt"}
    torch.jit.trace(network, torch.zeros(1, 1, 28, 28)).save(str(files["torchscript"]))
    torch.save(network[1].state_dict(), files["checkpoint"])  # without its Normalize
    return files


@pytest.mark.parametrize("source", ["torchscript", "checkpoint"])
def test_an_archive_with_flipped_bytes_is_refused_by_its_crc(source, tmp_path):
    """torch.jit.load and torch.load read a zip member without checking its CRC-32 (both
    load the flipped archive); the loader checks it first and names the file and the fix."""
    path = _mnist_cnn_files(tmp_path)[source]
    fields = {"architecture": "mnist-cnn"} if source == "checkpoint" else {}
    spec = ModelSpec(name="m", source=source, path=path, input_shape=(1, 28, 28),
                     num_classes=10, **fields)  # fmt: skip
    load_model(spec, torch.device("cpu"))  # intact: loads
    _flip_first_tensor_byte(path)
    assert zipfile.ZipFile(path).testzip() is not None  # the reference: the zip's own check
    with pytest.raises(ConfigError) as refused:
        load_model(spec, torch.device("cpu"))
    message = str(refused.value)
    assert f"{str(path)!r} is damaged: its member " in message
    assert "fails the zip archive's CRC-32 check" in message
    assert "copy or download the file again, or save the model again" in message


def test_evaluate_refuses_a_flipped_torchscript_archive_with_exit_2(tmp_path, capsys):
    path = _mnist_cnn_files(tmp_path)["torchscript"]
    _flip_first_tensor_byte(path)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"model: {{name: mine, source: torchscript, path: {path}, input_shape: [1, 28, 28]}}\n"
        "dataset: {name: mnist-embedded, limit: 4}\nmetrics: [ca]\ndevice: cpu\n"
    )
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and str(path) in err and "Traceback" not in err
