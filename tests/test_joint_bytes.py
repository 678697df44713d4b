"""``joint_alpha.joint_bytes`` bounds what a joint search step takes: the peak resident
growth of the search, measured in a fresh process (after a tiny search there: the first
search's one-off growth, code and allocator arenas, is not the step's), on a conv net with
a residual block and on a sigmoid/tanh MLP (the estimate before #33's tenth session was
0.6x the growth on sigmoid nets, and 3.4-4.3x on ReLU ones; docs/memory.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from aisafety.database.scaled_mlp import scaled_mlp
from aisafety.database.small_residual import small_residual
from aisafety.unit_cost import reset_peak_rss, status_bytes
from aisafety.verification import bounds as b
from aisafety.verification import budget
from aisafety.verification import joint_alpha as ja
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from tests import children

ROOT = Path(__file__).resolve().parents[1]


def sshape_mlp() -> nn.Module:
    """Four dense layers of 100, tanh and sigmoid in turn, every parameter times 3."""
    return scaled_mlp(0, 3.0, [48, 100, 100, 100, 100, 10], [nn.Tanh, nn.Sigmoid] * 2)


NETS = {
    "residual": lambda: (small_residual(8), (3, 16, 16), 0.02),
    "tiny": lambda: (small_residual(2), (3, 16, 16), 0.02),
    "sshape": lambda: (sshape_mlp(), (3, 4, 4), 0.05),
}


def setup(name: str, images: int):
    """The graph of ``name``, CROWN's boxes and the spec on ``images`` random images."""
    net, shape, eps = NETS[name]()
    x = torch.rand(images, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = net(x).argmax(1)
    graph = build_graph(net, shape, name)
    prop = robustness_property(x, y, eps, 10)
    lower, upper, spec = (t.to(graph.dtype) for t in (prop.lower, prop.upper, prop.spec))
    with torch.no_grad():
        crown = b.linear_boxes(graph, lower, upper)
    return graph, crown, spec


def measure_layerwise(name: str, images: int = 2) -> tuple[int, int]:
    """The layerwise search's chunk estimate and the peak resident growth of two steps of
    it on the last activation's input (``bounds._tighten``: the longest pass)."""
    graph, crown, _ = setup(name, images)
    last = max(op.inputs[0] for op in graph.ops if op.kind == "activation")
    chunks = []
    rows_per_chunk = budget.rows_per_chunk

    def spy(per_row: int, rows: int, fixed: int = 0, most: int | None = None) -> int:
        n = rows_per_chunk(per_row, rows, fixed, most)
        chunks.append(n * per_row + fixed)
        return n

    budget.rows_per_chunk = spy
    if not reset_peak_rss():
        return 0, 0  # the kernel does not let VmHWM be reset
    before = status_bytes("VmRSS")
    b._tighten(graph, last, list(crown), "adaptive", False, 2)
    return max(chunks), status_bytes("VmHWM") - before


def measure(name: str, images: int = 2) -> tuple[int, int]:
    """The estimate and the peak resident growth of two joint search steps on ``name``."""
    graph, crown, spec = setup(name, images)
    found = ja.targets(graph, crown)
    estimate = ja.joint_bytes(graph, spec.shape[0], found, spec.shape[1])
    if not reset_peak_rss():
        return 0, 0  # the kernel does not let VmHWM be reset
    before = status_bytes("VmRSS")
    for _ in ja.search(graph, found, crown, spec, 2, (0.1, 0.03)):
        pass  # a generator (it yields at early stops): run it to its last step
    return estimate, status_bytes("VmHWM") - before


MEASURED = ["residual", "sshape", "layerwise-sshape"]


@pytest.fixture(scope="module")
def measured() -> dict[str, subprocess.CompletedProcess]:
    """Each of ``MEASURED`` in a fresh process (its own peak), all three started at once."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "AISAFETY_MEMORY_LEDGER": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    commands = [[sys.executable, "-m", "tests.test_joint_bytes", name] for name in MEASURED]
    done = children.run_together(
        commands, cwd=ROOT, what="the joint search", capture_output=True, text=True, env=env
    )
    return dict(zip(MEASURED, done, strict=True))


@pytest.mark.parametrize("name", MEASURED)
def test_the_joint_step_estimate_bounds_the_measured_growth(name, measured):
    """And the layerwise search's (``budget.row_bytes`` with ``grad``) on the sigmoid/tanh
    MLP: it was 0.48x the growth on eran's sigmoid net before ``SSHAPE_SAVED``."""
    done = measured[name]
    assert done.returncode == 0, done.stderr[-2000:]
    estimate, grown = json.loads(done.stdout.strip().splitlines()[-1])
    if grown == 0:
        pytest.skip("the kernel does not report or reset VmHWM")
    assert grown > 1 << 20  # the search grew the process: the measurement measured something
    assert estimate >= grown, f"estimate {estimate / 2**20:.1f} MiB, grew {grown / 2**20:.1f}"


if __name__ == "__main__":
    torch.set_num_threads(1)
    measure("tiny", 1)  # the first search's one-off growth
    if sys.argv[1].startswith("layerwise-"):
        print(json.dumps(measure_layerwise(sys.argv[1].removeprefix("layerwise-"))))
    else:
        print(json.dumps(measure(sys.argv[1])))
