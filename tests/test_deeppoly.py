"""DeepPoly on the paper's running example (Singh et al. 2019, Fig. 2), its lower-slope
rule against CROWN's adaptive one, and its bounds equal to CROWN's per row."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification.deeppoly import deeppoly_lower_slope
from aisafety.verification.graph import build_graph
from aisafety.verification.property import Property, robustness_property
from aisafety.verification.registry import make_verifier
from aisafety.verification.relaxations import relu_default_slope


def running_example() -> nn.Sequential:
    """x3 = x1 + x2, x4 = x1 - x2; x7 = x5 + x6, x8 = x5 - x6; x11 = x9 + x10 + 1, x12 = x10."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    with torch.no_grad():
        for layer, bias in ((net[0], [0.0, 0.0]), (net[2], [0.0, 0.0]), (net[4], [1.0, 0.0])):
            layer.bias.copy_(torch.tensor(bias))
        net[0].weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
        net[2].weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
        net[4].weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    return net


def test_deeppoly_reproduces_the_papers_running_example():
    # x1, x2 in [-1, 1]: x3, x4 in [-2, 2], a tie (u = -l), so lambda = 0: x5 >= 0 and
    # x5 <= 0.5 x3 + 1 (likewise x6). Back-substituted: x7 = x5 + x6 >= 0 (the paper's
    # [0, 3]; stable, so its upper bound changes nothing and ours stays IBP's 4), x8 =
    # x5 - x6 in [-2, 2]; x9 = x7, so x11 - x12 = x9 + 1 >= 1: proved with bound 1.
    graph = build_graph(running_example(), (2,), "deeppoly-fig2")
    lower, upper = torch.full((1, 2), -1.0, dtype=torch.float64), torch.ones(1, 2).double()
    boxes = b.linear_boxes(graph, lower, upper)
    hidden = [boxes[op.inputs[0]] for op in graph.ops if op.kind == "activation"]
    # IBP's [-2, 2], widened outwards by its float64 rounding margin (ibp_rounding.py)
    (lo, hi) = (t.flatten().tolist() for t in hidden[0])
    assert lo == pytest.approx([-2.0, -2.0], abs=1e-14) and max(lo) <= -2.0
    assert hi == pytest.approx([2.0, 2.0], abs=1e-14) and min(hi) >= 2.0
    assert hidden[1][0].flatten().tolist() == pytest.approx([0.0, -2.0])
    assert hidden[1][1].flatten().tolist()[1] == pytest.approx(2.0)
    spec = torch.tensor([[[1.0, -1.0]]], dtype=torch.float64)
    prop = Property(lower, upper, spec, torch.zeros(1, 1, dtype=torch.float64))
    verifier = make_verifier(default_registry(), "deeppoly")
    assert verifier.lower_bounds(graph, prop)[0].item() == pytest.approx(1.0, abs=1e-12)
    assert verifier.verify(graph, prop).certified.all()


def test_deeppolys_slope_is_crowns_adaptive_slope_ties_included():
    generator = torch.Generator().manual_seed(0)
    lower = -torch.rand(10_000, generator=generator, dtype=torch.float64)
    upper = torch.rand(10_000, generator=generator, dtype=torch.float64)
    lower[:100] = -upper[:100]  # ties: lambda = 0, as the paper's x5 >= 0 on [-2, 2]
    chosen = deeppoly_lower_slope(lower, upper)
    assert (chosen[:100] == 0).all()
    assert torch.equal(chosen, relu_default_slope(lower, upper, "adaptive"))


def test_deeppoly_equals_crown_on_every_row():
    torch.manual_seed(2)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 12),
                        nn.ReLU(), nn.Linear(12, 3)).eval()  # fmt: skip
    graph = build_graph(net, (1, 4, 4), "fc")
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    prop = robustness_property(x, net(x).argmax(1), 0.2, 3)
    with torch.no_grad():
        found = {
            name: make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]
            for name in ("deeppoly", "crown")
        }
    assert torch.equal(found["deeppoly"], found["crown"])
