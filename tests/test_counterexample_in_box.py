"""A verifier's counterexample is the float32 point its replay checked, inside the box.

A float64 box's ends are rarely float32 numbers, and box-PGD searches in float32: its raw
point can sit a rounding step outside the box (5e-9 on the `eran` sigmoid net's spec 7259),
where ``replay`` checks the point ``falsify.into_box`` moved inside. The result used to keep
the raw point, so ``aisafety verify`` could print a counterexample outside its own box."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import Verdict


def _instance():
    """A linear net that the box's lowest corner breaks, on a float64 box whose ends are
    not float32 numbers."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 2)).eval()
    with torch.no_grad():
        net[1].weight.zero_()
        net[1].weight[0].fill_(1.0)  # class 0: the sum of the pixels; class 1: a threshold
        net[1].bias.copy_(torch.tensor([0.0, 7.9]))
    x = torch.full((1, 1, 4, 4), 0.5, dtype=torch.float64) + 1e-3 * torch.arange(16).view(
        1, 1, 4, 4
    )
    eps = 0.1 + 1e-9  # sum at the lowest corner: 8.12 - 1.6 < 7.9 there, > 7.9 at x
    prop = robustness_property(x, torch.zeros(1, dtype=torch.long), eps, 2)
    assert not torch.equal(prop.lower.float().double(), prop.lower)  # not float32 numbers
    return net, build_graph(net, (1, 4, 4), "linear", dtype=torch.float64), prop


@pytest.mark.parametrize("name", ["crown", "alpha-crown", "bab", "complete"])
def test_the_counterexample_is_inside_the_box_and_violates_the_property(name):
    net, graph, prop = _instance()
    model = lambda x: net(x.float())  # noqa: E731
    result = make_verifier(default_registry(), name, {"timeout": 30, "clock": "cpu"}).verify(
        graph, prop, model
    )
    assert result.verdicts[0] is Verdict.FALSIFIED
    point = result.counterexamples
    assert point.dtype == torch.float32 and prop.inside(point).all()
    with torch.no_grad():
        assert (prop.rows(model(point)) <= 0).any()
    assert float(result.margins[0]) <= 0


@pytest.mark.parametrize("exact", [False, True])
def test_the_milps_counterexample_is_reported_with_its_own_margin(monkeypatch, exact):
    """``complete``'s MILP path (box-PGD made to find nothing): the margin is the value of
    the rows at the float32 point returned (the one ``replay`` checked), as on the attack
    path, not the MILP's value at its own float64 point."""
    net, graph, prop = _instance()
    model = lambda x: net(x.float())  # noqa: E731
    verifier = make_verifier(
        default_registry(), "complete", {"timeout": 30, "clock": "cpu", "exact": exact}
    )
    assert verifier.engine(graph) == "milp"
    _assert_falsified_with_its_own_margin(monkeypatch, verifier, graph, prop, model)


@pytest.mark.parametrize("name", ["crown", "alpha-crown", "bab"])
def test_a_point_found_after_the_bounds_is_reported_with_its_own_margin(monkeypatch, name):
    """The box's centre and the bound's worst corner, tried after the bounds (box-PGD made
    to find nothing): the margin is the rows' value at the point returned, as box-PGD's is,
    not the (lower, rounded) bound."""
    net, graph, prop = _instance()
    model = lambda x: net(x.float())  # noqa: E731
    verifier = make_verifier(default_registry(), name, {"timeout": 30, "clock": "cpu"})
    _assert_falsified_with_its_own_margin(monkeypatch, verifier, graph, prop, model)


def _assert_falsified_with_its_own_margin(monkeypatch, verifier, graph, prop, model) -> None:
    """With box-PGD made to find nothing, ``verifier`` falsifies the instance with a point
    inside the box, reported with the rows' value at that point as its margin."""
    monkeypatch.setattr(
        verifier, "attack", lambda g, p, m: (torch.zeros(len(p), dtype=torch.bool), p.lower)
    )
    result = verifier.verify(graph, prop, model)
    assert result.verdicts[0] is Verdict.FALSIFIED
    point = result.counterexamples
    assert prop.inside(point).all()
    with torch.no_grad():
        value = prop.rows(model(point).double()).min()
    assert value <= 0
    assert float(result.margins[0]) == float(value.float())
