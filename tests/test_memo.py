"""``verification/memo.py``: a kept value is reused only while its inputs are unchanged."""

from __future__ import annotations

import torch

from aisafety.verification import bounds, memo, rounding
from aisafety.verification.graph import build_graph


def test_kept_value_is_recomputed_when_an_input_changes():
    lo, hi = torch.zeros(3), torch.ones(3)
    calls = []

    def compute():
        calls.append(1)
        return hi - lo

    first = memo.on_tensor(lo, "_width", (hi,), compute)
    assert memo.on_tensor(lo, "_width", (hi,), compute) is first and len(calls) == 1
    hi.add_(1.0)  # modified in place: recomputed
    assert torch.equal(memo.on_tensor(lo, "_width", (hi,), compute), torch.full((3,), 2.0))
    other = torch.full((3,), 5.0)  # another tensor: recomputed, with it
    assert torch.equal(memo.on_tensor(lo, "_width", (other,), lambda: other - lo), other)
    lo.sub_(1.0)
    assert torch.equal(memo.on_tensor(lo, "_width", (other,), lambda: other - lo), other + 1)
    assert len(calls) == 2


def test_crown_bounds_equal_with_and_without_kept_values():
    """The same CROWN bounds when every kept value is dropped before each use."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                              torch.nn.ReLU(), torch.nn.Linear(64, 5))  # fmt: skip
    graph = build_graph(net, (20,), "mlp", dtype=torch.float64)
    x = torch.randn(4, 20, dtype=torch.float64)
    spec = torch.eye(5, dtype=torch.float64).expand(4, 5, 5)

    def crown():
        with rounding.pass_precision("float32"):
            boxes = bounds.linear_boxes(graph, x - 0.3, x + 0.3)
            return bounds.spec_lower(graph, boxes, spec)[0]

    kept = crown()
    on_tensor = memo.on_tensor
    memo.on_tensor = lambda owner, name, deps, compute: compute()
    try:
        fresh = crown()
    finally:
        memo.on_tensor = on_tensor
    assert torch.equal(kept, fresh)


def test_nothing_is_kept_for_inputs_that_require_grad():
    lo, slope = torch.zeros(3), torch.ones(3, requires_grad=True)
    with torch.no_grad():
        memo.on_tensor(lo, "_scaled", (slope,), lambda: lo + slope)
    scaled = memo.on_tensor(lo, "_scaled", (slope,), lambda: lo + slope)
    assert scaled.requires_grad and "_scaled" not in lo.__dict__
