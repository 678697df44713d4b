"""CROWN's sigmoid/tanh lines are computed once per (layer, box) in a pass, not once per
backward pass through the layer (``SShapeRelaxation.lines``, ``memo.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.verification import bounds, memo
from aisafety.verification.graph import build_graph
from aisafety.verification.relaxations import SIGMOID, SShapeRelaxation

LAYERS = 6


def deep_net() -> nn.Module:
    """Six sigmoid/tanh layers (as eran's ffnnSIGMOID 6x200, narrower), weights scaled so
    that boxes cross the curved parts and every layer has intervals across 0."""
    torch.manual_seed(3)
    layers: list[nn.Module] = [nn.Flatten()]
    for i in range(LAYERS):
        layers += [nn.Linear(16 if i == 0 else 12, 12), nn.Sigmoid() if i % 2 else nn.Tanh()]
    net = nn.Sequential(*layers, nn.Linear(12, 3))
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(2)
    return net.eval()


def crown(graph, x, eps):
    spec = torch.eye(3, dtype=graph.dtype).expand(len(x), 3, 3) - torch.eye(3)[0]
    boxes = bounds.linear_boxes(graph, x - eps, x + eps)
    return bounds.spec_lower(graph, boxes, spec[:, 1:])[0], boxes


@pytest.fixture
def counted(monkeypatch):
    """The number of times CROWN's slopes are computed (``default_slopes``)."""
    calls = []
    original = SShapeRelaxation.default_slopes

    def counting(self, lo, hi):
        calls.append(lo.shape)
        return original(self, lo, hi)

    monkeypatch.setattr(SShapeRelaxation, "default_slopes", counting)
    return calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_crown_pass_computes_each_layers_lines_once(counted, monkeypatch, dtype):
    graph = build_graph(deep_net(), (1, 4, 4), "deep", dtype=dtype)
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=dtype)
    kept, _ = crown(graph, x, 0.05)
    assert len(counted) == LAYERS  # one per layer, where every pass recomputing: 21
    # recomputed per pass (the code before the cache): 1 + 2 + ... + 6, the same bounds
    monkeypatch.setattr(SShapeRelaxation, "lines", SShapeRelaxation._lines)
    fresh, _ = crown(graph, x, 0.05)
    assert len(counted) == LAYERS + LAYERS * (LAYERS + 1) // 2
    assert torch.equal(kept, fresh)


def test_lines_are_recomputed_when_the_box_or_the_rule_changes(counted, monkeypatch):
    lo, hi = torch.linspace(-3, 1, 8, dtype=torch.float64), torch.linspace(-1, 4, 8).double()
    first = SIGMOID.lines(lo, hi)
    assert SIGMOID.lines(lo, hi) is first and len(counted) == 1
    hi.add_(0.5)  # modified in place: recomputed, and as computed afresh
    again = SIGMOID.lines(lo, hi)
    assert len(counted) == 2 and all(map(torch.equal, again, SIGMOID._lines(lo, hi)))
    monkeypatch.setattr(SIGMOID, "rule", "chord")  # bench/sigmoid_lines.py switches rules
    chord = SIGMOID.lines(lo, hi)
    assert len(counted) == 4 and torch.equal(chord[0], SIGMOID.chord(lo, hi))


def test_searched_slopes_and_boxes_with_gradients_are_never_kept(counted):
    lo = torch.linspace(-3, 1, 8, dtype=torch.float64).reshape(1, 8)
    hi = lo + 1.5
    slopes = torch.rand(1, 2, 2, 8, dtype=torch.float64)  # (B, K, 2, ...): alpha-CROWN's
    SIGMOID.lines(lo, hi, slopes)
    assert not [k for k in lo.__dict__ if k.startswith("_sshape_lines")]
    moving = lo.clone().requires_grad_(True)  # the joint search's boxes
    SIGMOID.lines(moving, hi)
    SIGMOID.lines(moving, hi)
    assert len(counted) == 2 and not moving.__dict__


def test_alpha_crown_bounds_are_the_same_with_and_without_kept_lines(monkeypatch):
    graph = build_graph(deep_net(), (1, 4, 4), "deep")
    x = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    spec = torch.eye(3, dtype=torch.float64).expand(2, 3, 3) - torch.eye(3)[0]

    def alpha():
        boxes = bounds.linear_boxes(graph, x - 0.03, x + 0.03, alpha_steps=3)
        return bounds.optimise_slopes(graph, boxes, spec[:, 1:], steps=5)[0]

    kept = alpha()
    monkeypatch.setattr(memo, "on_tensor", lambda owner, name, deps, compute: compute())
    assert torch.equal(kept, alpha())
