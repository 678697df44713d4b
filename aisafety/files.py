"""Files read from outside, checked by ``stat`` before they are opened.

``open`` on a FIFO blocks until a writer appears, ``/dev/zero`` never ends and a directory
cannot be read; ``Path.is_file()`` is False for all three, which used to be reported as
"does not exist". One ``os.stat`` (no open) tells what the path is and how large, so a
wrong path gets the right message and a huge file is refused before a byte is read.
A model archive is also checked against the CRC-32 of its members: torch does not check.
"""

from __future__ import annotations

import io
import os
import stat
import zipfile
import zlib
from pathlib import Path

from aisafety.errors import ConfigError

GIB = 1 << 30
MAX_MODEL_BYTES = 8 * GIB  # a model file read whole (checkpoint, TorchScript, ONNX)

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def regular_file(path: str | Path, what: str, max_bytes: int | None = None) -> Path:
    """``path`` if it is a regular file of at most ``max_bytes``; else a ``ConfigError``
    that says what ``what`` (e.g. "config file") names instead, and the fix."""
    path = Path(path).expanduser()
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(path)!r} does not exist; check the path") from None
    except OSError as exc:
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {exc.strerror}") from None
    for test, kind in _KINDS:
        if test(info.st_mode):
            raise ConfigError(
                f"{what} {str(path)!r} is {kind}, not a regular file; give the path of the file "
                "itself"
            )
    if max_bytes is not None and info.st_size > max_bytes:
        raise ConfigError(
            f"{what} {str(path)!r} is {info.st_size:,} bytes, above the limit of {max_bytes:,} "
            "bytes read whole: is this the right file?"
        )
    return path


def read_regular_file(path: str | Path, what: str, max_bytes: int | None = None) -> bytes:
    """``regular_file``'s checks, then the bytes: a file this user may not read (or that
    fails to read) is a ``ConfigError`` naming it and the reason, not a traceback."""
    checked = regular_file(path, what, max_bytes)
    try:
        return checked.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"{what} {str(checked)!r} cannot be read: {exc.strerror or exc}; check its "
            "permissions and those of its folders (ls -l), or copy it where this user can read it"
        ) from None


def intact_archive(source: str | Path | bytes, what: str) -> None:
    """Refuse a zip archive (what ``torch.save``, ``torch.jit.save`` and
    ``torch.export.save`` write) whose members do not match their CRC-32. torch reads the
    members without checking, so flipped bytes in a tensor's data load silently as other
    weights. Files that are not zip archives (ONNX, legacy pickles) are left to their loader."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    if not zipfile.is_zipfile(handle):
        return
    try:
        with zipfile.ZipFile(handle) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        bad = f"? ({exc})"
    if bad is not None:
        raise ConfigError(
            f"{what} is damaged: its member {bad!r} fails the zip archive's CRC-32 check (its "
            "bytes changed after it was saved: an interrupted copy or download, or a disk "
            "error); copy or download the file again, or save the model again"
        )
