"""The CIFAR-10 VNN-COMP instances of shared/data (``cifar10-models/*/instances.csv``) and
the independent replay of a ``sat`` counterexample through onnxruntime: read by
tests/test_vnncomp_cifar10.py and the benches (bench/verify_cifar10.py, bench/abcrown/run.py)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np


def instances(root: Path) -> list[tuple[Path, Path, float]]:
    """(network, property, VNN-COMP timeout) per row; the CSV keeps the origin's folders
    (``onnx/x.onnx``, ``specs/y.vnnlib``, ``folder/file.vnnlib``) that were flattened here."""
    found = []
    for table in sorted(root.glob("*/instances.csv")):
        folder = table.parent
        with table.open() as f:
            for row in csv.reader(f):
                if not row:
                    continue
                network = folder / Path(row[0]).name
                parts = Path(row[1]).parts
                spec = folder / "vnnlib" / "__".join(parts[-2:])
                if not spec.is_file():
                    spec = folder / "vnnlib" / parts[-1]
                found.append((network, spec, float(row[2])))
    return found


def replays(network: Path, spec: Path, counterexample: str) -> bool:
    """The counterexample lies in the box and violates the property under onnxruntime."""
    import onnxruntime as ort
    import torch

    from aisafety.verification.vnnlib import read_disjuncts

    values = dict(
        (name, float(v)) for name, v in (line.strip("() \n").split() for line in
                                          counterexample.splitlines() if line.strip("() \n"))
    )  # fmt: skip
    session = ort.InferenceSession(str(network), providers=["CPUExecutionProvider"])
    graph_input = session.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in graph_input.shape]
    n = math.prod(shape)
    x = np.array([values[f"X_{i}"] for i in range(n)], np.float32)
    y = session.run(None, {graph_input.name: x.reshape(shape)})[0].reshape(-1)
    (lower, upper), disjuncts = read_disjuncts(spec, n, len(y))
    inside = bool(
        ((torch.from_numpy(x).double() >= lower) & (torch.from_numpy(x).double() <= upper)).all()
    )
    out = torch.from_numpy(y).double()
    violated = any(all(float(c @ out + d) <= 0 for c, d in rows) for rows in disjuncts)
    return inside and violated


def moved_into_box(spec: Path, text: str) -> tuple[str, int]:
    """The counterexample ``((X_0 v) ... (Y_0 v) ...)`` with every input that lies one
    float32 step outside the box moved that step in, and how many moved: a peer's float32
    point on a box end that float32 cannot hold (alpha-beta-CROWN's, bench/abcrown/run.py)
    is then replayed as ``falsify.into_box`` puts ours in the box; an input further out
    stays, so ``replays`` still fails on it."""
    from aisafety.verification.vnnlib import read_disjuncts

    pairs = [line.strip("() \n").split() for line in text.splitlines() if line.strip("() \n")]
    values = {name: float(v) for name, v in pairs}
    n = sum(name.startswith("X_") for name in values)
    (lower, upper), _ = read_disjuncts(spec, n, sum(name.startswith("Y_") for name in values))
    count = 0
    for i, (lo, hi) in enumerate(zip(lower.tolist(), upper.tolist(), strict=True)):
        x = np.float32(values[f"X_{i}"])
        if lo <= float(x) <= hi:  # in float64: numpy would compare in float32
            continue
        step = np.nextafter(x, np.float32(np.inf if float(x) < lo else -np.inf))
        if lo <= float(step) <= hi:
            values[f"X_{i}"], count = float(step), count + 1
    return "\n".join(f"({name} {v!r})" for name, v in values.items()), count
