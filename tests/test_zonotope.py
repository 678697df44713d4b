"""DeepZ: its closed form on a hand-built net, every sampled point inside its zonotopes,
and its bounds equal to the dual network's (WK) and Fast-Lin's where theory says so."""

from __future__ import annotations

import pytest
import torch
from test_verification import two_layer_net  # one hand-built net for both files
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier
from aisafety.verification.zonotope import affine, concretize, input_zonotope, relu


def bounds_of(name: str, graph, prop) -> torch.Tensor:
    with torch.no_grad():
        return make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]


def test_deepz_matches_its_closed_form_on_a_hand_built_net():
    # x in [0.4, 0.6]^2: c = (0.5, 0.5), G = diag(0.1, 0.1). z1 = x1 - x2: c 0, G (0.1, -0.1),
    # [-0.2, 0.2], unstable: lambda 0.5, mu 0.05, so h1: c 0.05, G (0.05, -0.05, 0.05).
    # z2 = 2 x1 + x2 - 1: c 0.5, G (0.2, 0.1), [0.2, 0.8], active: h2 = z2.
    # f1 - f0 = -2 h1 + 3 h2 - 0.5: c 0.9, G (0.5, 0.4, -0.1): bound 0.9 - 1.0 = -0.1;
    # f0 - f1: -0.9 - 1.0 = -1.9.
    graph = build_graph(two_layer_net(), (2,), "two-layer")
    x = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    prop = robustness_property(x, torch.tensor([1, 0]), 0.1, 2)
    hidden = relu(affine(graph.ops[1], input_zonotope(prop.lower[:1], prop.upper[:1])))
    assert hidden[0].flatten().tolist() == pytest.approx([0.05, 0.5])
    assert hidden[1][0].T.flatten().tolist() == pytest.approx([0.05, -0.05, 0.05, 0.2, 0.1, 0.0])
    assert bounds_of("deepz", graph, prop).flatten().tolist() == pytest.approx([-0.1, -1.9])


def steep_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2),
                        nn.ReLU(), nn.Flatten(), nn.Linear(4, 3))  # fmt: skip
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(2.0)
    return net.eval()


@pytest.mark.parametrize("eps", [0.05, 0.3])
def test_every_sampled_point_is_inside_deepzs_zonotopes(eps):
    net = steep_net()
    graph = build_graph(net, (1, 4, 4), "steep")
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(3))
    prop = robustness_property(x, net(x).argmax(1), eps, 3)
    noise = torch.rand(500, *x.shape, generator=torch.Generator().manual_seed(4))
    points = (prop.lower + noise * (prop.upper - prop.lower)).flatten(0, 1)  # (500 B, ...)
    values = points
    zonotope = input_zonotope(prop.lower, prop.upper)
    for op in graph.ops[1:]:
        zonotope = relu(zonotope) if op.kind == "activation" else affine(op, zonotope)
        values = op.forward(values)
        lower, upper = concretize(zonotope)
        seen = values.reshape(500, *lower.shape)
        assert (seen >= lower - 1e-9).all() and (seen <= upper + 1e-9).all(), op.name
    rows = torch.stack([prop.rows(v) for v in values.reshape(500, len(x), 3)])
    assert (bounds_of("deepz", graph, prop) <= rows.amin(0) + 1e-9).all()


@pytest.mark.parametrize("eps", [0.05, 0.2, 0.5])
def test_deepz_equals_the_dual_network_row_by_row(eps):
    # DeepZ's parallelogram has Fast-Lin's two lines (lambda z and lambda (z - l)); with
    # bounds from the same relaxation its bounds are the dual network's (Salman et al. 2019)
    net = steep_net()
    graph = build_graph(net, (1, 4, 4), "steep")
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    prop = robustness_property(x, net(x).argmax(1), eps, 3)
    assert bounds_of("deepz", graph, prop) == pytest.approx(bounds_of("wk", graph, prop), abs=1e-10)


@pytest.mark.parametrize("eps", [0.05, 0.1])
def test_refinezono_is_between_deepz_and_the_exact_milp_and_refines(eps):
    from aisafety.verification import bounds as b
    from aisafety.verification.milp import encode, minimise_row

    net = steep_net()
    graph = build_graph(net, (1, 4, 4), "steep")
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    prop = robustness_property(x, net(x).argmax(1), eps, 3)
    deepz, refined = bounds_of("deepz", graph, prop), bounds_of("refinezono", graph, prop)
    assert (deepz <= refined).all() and (refined > deepz + 1e-3).any()
    boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    for s in range(len(x)):
        enc = encode(graph, [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in boxes])
        for k, row in enumerate(prop.spec[s].numpy()):
            exact, value, _ = minimise_row(enc, row, 0.0, 30.0)
            assert exact == pytest.approx(value, abs=1e-6)
            assert refined[s, k] <= exact + 1e-6, (s, k)
