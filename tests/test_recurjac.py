"""RecurJac against the exact largest gradient norm over the box (every activation pattern
the box reaches, each checked by an LP), against sampled gradients coordinate by
coordinate, and against FastLip, which it never exceeds (its paper's claim, proved in the
module docstring) and beats where a derivative sign is known below an unsure ReLU."""

from __future__ import annotations

import copy

import pytest
import torch
from test_lipschitz import exact_largest_gradient, tiny_net
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.lipschitz import jacobian_bound
from aisafety.verification.property import robustness_property
from aisafety.verification.recurjac import recurjac_bound
from aisafety.verification.registry import make_verifier


@pytest.mark.parametrize("eps", [0.05, 0.2, 0.5])
def test_recurjac_is_between_the_exact_largest_gradient_and_fastlip(eps):
    net = tiny_net()
    graph = build_graph(net, (3,), "tiny")
    x = torch.tensor([[0.4, 0.5, 0.6], [0.5, 0.3, 0.5]])
    prop = robustness_property(x, net(x).argmax(1), eps, 2)
    recurjac, fastlip = recurjac_bound(graph, prop), jacobian_bound(graph, prop)
    assert (recurjac <= fastlip + 1e-12).all()
    for s in range(len(x)):
        lower, upper = prop.lower[s].numpy(), prop.upper[s].numpy()
        for k, c in enumerate(prop.spec[s].numpy()):
            exact = exact_largest_gradient(net, lower, upper, c)
            assert exact <= recurjac[s, k].sum() + 1e-9, (s, k)


def test_recurjac_is_strictly_tighter_than_fastlip_on_the_tiny_net():
    """At eps 0.2 (measured: FastLip 0.380 and 0.493, RecurJac 0.344 and 0.456, exact 0.268)."""
    net = tiny_net()
    graph = build_graph(net, (3,), "tiny")
    x = torch.tensor([[0.4, 0.5, 0.6], [0.5, 0.3, 0.5]])
    prop = robustness_property(x, net(x).argmax(1), 0.2, 2)
    gap = jacobian_bound(graph, prop).sum(2) - recurjac_bound(graph, prop).sum(2)
    assert (gap > 0.03).all()


def deep_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 10),
                         nn.ReLU(), nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                         nn.Linear(8, 3)).eval()  # fmt: skip


@pytest.mark.parametrize("seed, eps", [(0, 0.05), (1, 0.1), (2, 0.3)])
def test_every_sampled_gradient_coordinate_is_inside_the_bound_on_a_deep_net(seed, eps):
    net = deep_net(seed)
    graph = build_graph(net, (1, 4, 4), "deep")
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        prop = robustness_property(x, net(x).argmax(1), eps, 3)
    recurjac, fastlip = recurjac_bound(graph, prop), jacobian_bound(graph, prop)
    assert (recurjac <= fastlip + 1e-12).all()
    generator, double = torch.Generator().manual_seed(seed), copy.deepcopy(net).double()
    for s in range(len(x)):
        low, high = prop.lower[s].double(), prop.upper[s].double()
        points = low + (high - low) * torch.rand(4000, *low.shape, generator=generator,
                                                 dtype=torch.float64)  # fmt: skip
        points.requires_grad_(True)
        out = double(points)
        for k, c in enumerate(prop.spec[s]):
            (grad,) = torch.autograd.grad((out @ c.double()).sum(), points, retain_graph=True)
            assert (grad.abs().amax(0) <= recurjac[s, k] + 1e-9).all(), (s, k)


def test_on_a_linear_layer_the_bound_is_the_exact_minimum():
    net = nn.Sequential(nn.Flatten(), nn.Linear(6, 3))
    graph = build_graph(net, (1, 2, 3), "linear")
    x = torch.rand(4, 1, 2, 3, generator=torch.Generator().manual_seed(2))
    prop = robustness_property(x, net(x).argmax(1), 0.1, 3)
    fastlip = make_verifier(default_registry(), "fastlip").lower_bounds(graph, prop)[0]
    recurjac = make_verifier(default_registry(), "recurjac").lower_bounds(graph, prop)[0]
    assert recurjac == pytest.approx(fastlip, abs=1e-12)  # both exact there (test_lipschitz)


def test_recurjac_names_a_network_it_cannot_bound():
    smooth = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    with pytest.raises(VerificationError, match="'recurjac' needs a sequential ReLU.*'tanh'"):
        make_verifier(default_registry(), "recurjac").check(build_graph(smooth, (4,), "tanh"))
