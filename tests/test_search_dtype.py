"""``bounds.SEARCH_DTYPE = torch.float64`` (a search done wholly in float64, for exact
comparisons) runs every slope and split search in float64: the joint slope search (it
crashed: ``float64_margin.dot`` signed in place a tensor autograd kept for the boxes'
gradient, which only a float64 search has) and the split searches of ``bab`` and the
conjunction search (``split_bounds`` had imported the float32 value, so they stayed
float32 beside a float64 root). Checked against the exact minimum (HiGHS) and sampled
values."""

from __future__ import annotations

import torch
from test_conjunction_search import RELU_CASES, relu_instance, search, whole_box_below
from verifier_fuzz import random_case, reference

from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification.registry import make_verifier


def test_the_conjunction_search_runs_in_float64_when_asked(monkeypatch):
    """A conjunction with a joint root search and ReLU splits: proved, its margin below
    the exact min-max, and every split domain's multipliers float64."""
    monkeypatch.setattr(b, "SEARCH_DTYPE", torch.float64)
    net, prop = relu_instance(*RELU_CASES[0])
    config = {"domain_batch": 8, "joint": True}
    outcome, _, leaves, boxes, graph = search(net, (1, 4, 4), prop, config)
    assert outcome.point is None and not outcome.why and outcome.margin > 0  # unsat
    assert not whole_box_below(graph, boxes, prop, outcome.margin - 1e-7)
    multipliers = [t for leaf in leaves for t in (*leaf.alpha.values(), *leaf.beta.values())]
    assert multipliers and all(t.dtype == torch.float64 for t in multipliers)


def test_the_joint_slope_search_runs_in_float64_when_asked(monkeypatch):
    """alpha-CROWN's joint search (a sigmoid/tanh conv net, fuzz seed 1193) in float64:
    below every sampled value, and at least CROWN's bound."""
    case = random_case(1193)
    graph, prop = case.graph.in_dtype(torch.float64), case.prop.to(torch.float64)
    settings = {"timeout": 30.0, "clock": "cpu", "steps": 5}
    with torch.no_grad():
        crown, _ = make_verifier(default_registry(), "crown").lower_bounds(graph, prop)
        monkeypatch.setattr(b, "SEARCH_DTYPE", torch.float64)
        alpha, _ = make_verifier(default_registry(), "alpha-crown", settings).lower_bounds(
            graph, prop
        )
    ref = reference(case)
    assert alpha.dtype == torch.float64 and (alpha >= crown).all()
    assert (alpha + prop.offset <= ref.lowest + ref.tolerance).all()
