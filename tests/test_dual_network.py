"""WK (the dual network, Wong & Kolter 2018) equals Fast-Lin where theory says so: against
Fast-Lin's own backward pass on the same (unintersected) bounds, row by row; and it refuses
what it cannot bound."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier


def fast_lin_without_intervals(graph, prop) -> torch.Tensor:
    """Fast-Lin as Weng et al. state it: every ReLU input's bounds by the backward pass with
    the parallel lower line, for every neuron, never intersected with IBP's."""
    boxes = b.interval_boxes(graph, prop.lower, prop.upper)
    for op in graph.ops:
        if op.kind != "activation":
            continue
        j = op.inputs[0]
        lo = boxes[j][0]
        n = lo[0].numel()
        eye = torch.eye(n, dtype=lo.dtype).expand(len(lo), n, n)
        rows = torch.cat([eye, -eye], 1).reshape(len(lo), 2 * n, *lo.shape[1:])
        bound, _ = b.backward(graph, j, rows, boxes, "parallel")
        boxes[j] = bound[:, :n].reshape(lo.shape), -bound[:, n:].reshape(lo.shape)
        for k in range(j + 1, len(graph.ops)):
            boxes[k] = graph.ops[k].interval(*(boxes[i] for i in graph.ops[k].inputs))
    return b.spec_lower(graph, boxes, prop.spec, "parallel")[0]


def bounds_of(name: str, graph, prop) -> torch.Tensor:
    with torch.no_grad():
        return make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]


def nets() -> list[nn.Module]:
    torch.manual_seed(0)
    fc = nn.Sequential(nn.Flatten(), nn.Linear(16, 20), nn.ReLU(), nn.Linear(20, 20), nn.ReLU(),
                       nn.Linear(20, 20), nn.ReLU(), nn.Linear(20, 3))  # fmt: skip
    conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(4, 3))  # fmt: skip
    return [fc.eval(), conv.eval()]


@pytest.mark.parametrize("eps", [0.05, 0.2, 0.5])
@pytest.mark.parametrize("index", [0, 1], ids=["fc", "conv"])
def test_wk_equals_fast_lin_on_the_same_bounds_row_by_row(index, eps):
    net = nets()[index]
    graph = build_graph(net, (1, 4, 4), "net")
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        prop = robustness_property(x, net(x).argmax(1), eps, 3)
    wk = bounds_of("wk", graph, prop)
    assert wk == pytest.approx(fast_lin_without_intervals(graph, prop), abs=1e-10)
    if index == 0:  # no interval bound is tighter on this net: the registered Fast-Lin too
        assert wk == pytest.approx(bounds_of("fast-lin", graph, prop), abs=1e-10)


def test_wk_names_a_network_it_cannot_bound():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(x + torch.relu(self.a(x)))

    wk = make_verifier(default_registry(), "wk")
    with pytest.raises(VerificationError, match="'wk' cannot bound add node.*'res'"):
        wk.check(build_graph(Residual(), (4,), "res"))
    smooth = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    with pytest.raises(VerificationError, match="'wk' needs a sequential ReLU.*'tanh'"):
        wk.check(build_graph(smooth, (4,), "tanh"))
