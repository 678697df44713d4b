"""Do CROWN's bounds depend on the memory budget? The rows of a pass go in chunks sized to
the budget (``budget.rows_per_chunk``), and the default budget follows free memory, so a
run's bounds may differ from another's on the same input. This bounds the same inputs
unchunked and under smaller budgets and prints, per net, pass precision (``auto``: the
shipped choice; ``float64``/``float32`` forced) and budget, the largest difference of any
box end and of the spec rows' bound, and whether all are bit-identical (``torch.equal``).

    python bench/chunk_determinism.py

Two causes are separated that way: under ``auto`` a pass runs in float32 (with rounding
margins) or float64 by its chunk's size (``rounding.fast_graph``: ``SMALL`` elements), so
a smaller chunk can switch precision; with the precision forced, what is left is the order
of the sums inside the convolution and matrix kernels, which depends on how many rows
they get. No timing: the output is deterministic up to those two causes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from aisafety.database.scaled_mlp import scaled_mlp
from aisafety.verification import bounds as b
from aisafety.verification import budget, rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property

BUDGETS = {"16 MiB": 2**24, "4 MiB": 2**22, "one row": 1}


def conv_net() -> nn.Module:
    """Two convolutions and two dense layers, 3x16x16 in, 10 classes."""
    torch.manual_seed(4)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
        nn.ReLU(), nn.Flatten(), nn.Linear(512, 50), nn.ReLU(), nn.Linear(50, 10),
    ).eval()  # fmt: skip


def cases():
    """(name, graph, property): the conv net at eps 0.01 and a 784-200x3 ReLU MLP at 0.003,
    two images each."""
    net = conv_net()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = net(x).argmax(1)
    yield "conv 3x16x16", build_graph(net, (3, 16, 16), "conv"), robustness_property(x, y, 0.01, 10)
    mlp = scaled_mlp(3, 2.0, [784, 200, 200, 200, 10], [nn.ReLU] * 3)
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = mlp(x).argmax(1)
    yield (
        "mlp 784-200x3",
        build_graph(mlp, (1, 28, 28), "mlp"),
        robustness_property(x, y, 0.003, 10),
    )


def crown(graph, prop, limit: int | None):
    """CROWN's boxes and spec bound, under ``limit`` bytes (None: the default budget)."""
    with torch.no_grad():
        if limit is None:
            boxes = b.linear_boxes(graph, prop.lower, prop.upper)
            return boxes, b.spec_lower(graph, boxes, prop.spec)[0]
        with budget.memory_limit(limit):
            boxes = b.linear_boxes(graph, prop.lower, prop.upper)
            return boxes, b.spec_lower(graph, boxes, prop.spec)[0]


def compare(whole, part) -> tuple[float, float, bool]:
    """Largest box-end difference, largest spec-bound difference, bit-identical."""
    ends = [
        (u, v)
        for (a, c), (d, e) in zip(whole[0], part[0], strict=True)
        for u, v in ((a, d), (c, e))
    ]
    box = max(float((u - v).abs().max()) for u, v in ends)
    spec = float((whole[1] - part[1]).abs().max())
    same = all(torch.equal(u, v) for u, v in ends) and torch.equal(whole[1], part[1])
    return box, spec, same


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from bab_speed import cpu_model

    torch.set_num_threads(1)
    print(f"CROWN bounds unchunked vs under a budget; {cpu_model()}, one thread")
    head = ("net", "precision", "budget", "max box diff", "max spec diff")
    print(f"{head[0]:16} {head[1]:9} {head[2]:8} {head[3]:>13} {head[4]:>14}  bit-identical")
    for name, graph, prop in cases():
        for mode in ("auto", "float64", "float32"):
            with rounding.pass_precision(mode):
                whole = crown(graph, prop, None)
                for label, limit in BUDGETS.items():
                    box, spec, same = compare(whole, crown(graph, prop, limit))
                    print(f"{name:16} {mode:9} {label:8} {box:13.3g} {spec:14.3g}  {same}")


if __name__ == "__main__":
    main()
