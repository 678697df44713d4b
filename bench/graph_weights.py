"""CROWN on float32 graphs built from a module: weights detached (as shipped) against the
module's parameters kept (as before; what ``build_graph(..., trainable=True)`` still gives
training), one thread.

    python bench/graph_weights.py [--pairs 11] [--images 4]

Before, a float32 graph held the network's parameters, which require grad, so every box
and bound CROWN computed carried an autograd graph (and the kept values of ``memo.py``,
CROWN's sigmoid lines among them, were never kept). Per net (a Conv-Small-shaped ReLU CNN
on 28x28, a 6x100 sigmoid/tanh MLP), each pair runs one CROWN pass (``linear_boxes`` and
the margins' bound, ``--images`` images) on each graph, interleaved, the order
alternating. Printed: median CPU seconds each way, the paired median of detached / kept,
the median peak resident growth of a pass each way (``VmHWM`` reset before it, minus the
resident size then), and whether the bounds are bit-identical; where not, whether the
detached graph's are at most the kept one's (a sigmoid's float32 intercepts are rounded
outwards only on tensors without gradients: the kept graph's were only cast, which can
put a line on the wrong side of f by float32's rounding). Work is bounded by pairs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from aisafety.unit_cost import reset_peak_rss, status_bytes
from aisafety.verification import bounds as b
from aisafety.verification.graph import build_graph

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from paired import interleaved, one_thread, paired_median  # noqa: E402


def conv_small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 4, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 4, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 100), nn.ReLU(), nn.Linear(100, 10),
    ).eval()  # fmt: skip


def sshape_mlp() -> nn.Module:
    torch.manual_seed(1)
    layers: list[nn.Module] = [nn.Flatten()]
    for i in range(6):
        layers += [nn.Linear(784 if i == 0 else 100, 100), nn.Sigmoid() if i % 2 else nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(100, 10)).eval()


def one_pass(graph, x: torch.Tensor, eps: float) -> tuple[float, float, torch.Tensor]:
    """CPU seconds, peak resident growth (MiB) and the bounds of one CROWN pass."""
    spec = torch.eye(10).expand(len(x), 10, 10) - torch.eye(10)[0]
    reset_peak_rss()
    resident = status_bytes("VmRSS")
    began = time.process_time()
    boxes = b.linear_boxes(graph, (x - eps).clamp(0, 1), (x + eps).clamp(0, 1))
    bound = b.spec_lower(graph, boxes, spec[:, 1:])[0]
    cpu = time.process_time() - began
    peak = (status_bytes("VmHWM") - resident) / 2**20
    return cpu, peak, bound.detach()


def compare(name: str, net: nn.Module, images: int, eps: float, pairs: int) -> None:
    graphs = {
        "detached": build_graph(net, (1, 28, 28), name, torch.float32),
        "kept": build_graph(net, (1, 28, 28), name, torch.float32, trainable=True),
    }
    x = torch.rand(images, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    runs = interleaved(list(graphs), lambda way: one_pass(graphs[way], x, eps), pairs)
    cpu = {way: [run[0] for run in runs[way]] for way in graphs}
    peak = {way: [run[1] for run in runs[way]] for way in graphs}
    bounds = {way: runs[way][-1][2] for way in graphs}
    ratio = paired_median(cpu["detached"], cpu["kept"])
    same = torch.equal(bounds["detached"], bounds["kept"])
    gap = bounds["kept"].double() - bounds["detached"].double()
    print(f"{name} ({images} images, eps {eps}): detached / kept CPU, paired median "
          f"{ratio:.3f}x; bit-identical bounds: {same}; detached <= kept everywhere: "
          f"{bool((gap >= 0).all())}, largest difference {float(gap.abs().max()):.2e}")  # fmt: skip
    for way in graphs:
        print(f"  {way:9s} median {statistics.median(cpu[way]) * 1e3:8.1f} ms CPU, peak "
              f"resident growth {statistics.median(peak[way]):7.1f} MiB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=11)
    parser.add_argument("--images", type=int, default=4)
    args = parser.parse_args()
    print(f"{args.pairs} interleaved pairs, {one_thread()}")
    compare("conv-small", conv_small(), args.images, 0.02, args.pairs)
    compare("sigmoid/tanh 6x100", sshape_mlp(), args.images, 0.01, args.pairs)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
