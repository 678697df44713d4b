"""A VNN-COMP file given gzip-compressed (``net.onnx.gz``, ``prop.vnnlib.gz``), unpacked
where the verifier can read it: ``aisafety verify`` on one instance and on a benchmark's
``instances.csv`` (``cli/benchmark.py``) both read them."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path


def unpacked(path: str, folder: str) -> str:
    """``path``, or where a gzip-compressed file is unpacked (named without ``.gz``):
    VNN-COMP's benchmark repositories since 2022 ship ``net.onnx.gz`` and ``prop.vnnlib.gz``
    (alpha-beta-CROWN reads such a network directly, onnx.load(gzip.GzipFile(path))); read
    as they were, they were refused as 'not an ONNX model' and 'not text (a network given as
    the property?)'."""
    source = Path(path)
    try:
        with source.open("rb") as file:
            if file.read(2) != b"\x1f\x8b":
                return path
    except OSError:  # missing, a folder, unreadable: verify_instance names it
        return path
    target = Path(folder) / source.name.removesuffix(".gz")
    with gzip.open(source) as packed, target.open("wb") as out:
        shutil.copyfileobj(packed, out)
    return str(target)
