"""``refine.py``'s MILP-tightened boxes against the exact extremes (rationals,
``tests/exact_regions.py``), and what a certificate on them says: they rest on HiGHS's MIP
dual bound moved out by ``SAFETY``, which no safe bound checks (HiGHS's tree is not
exposed), so ``complete`` notes it, as it notes MILP rows (``complete.MIP_NOTE``)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from aisafety.verification import bounds as b
from aisafety.verification import refine
from aisafety.verification.complete import MIP_NOTE, REFINED_NOTE
from aisafety.verification.deadline import CLOCKS, Deadline
from aisafety.verification.graph import build_graph
from aisafety.verification.milp import Solved
from tests.exact_regions import extremes

WIDTHS = (2, 10, 9, 8, 3)


def small_net_and_box(seed: int, scale: float):
    """A 2-10-9-8-3 ReLU net (weights scaled by ``scale``) and a random box of radius
    0.05-0.35 in the plane (``bench/refine_slack.py``'s nets)."""
    torch.manual_seed(seed)
    layers = []
    for n_in, n_out in zip(WIDTHS[:-1], WIDTHS[1:], strict=True):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
    net = nn.Sequential(*layers[:-1]).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    centre = torch.rand(2, dtype=torch.float64)
    radius = 0.05 + 0.3 * torch.rand(1, dtype=torch.float64)
    return net, centre - radius, centre + radius


def _cpu_deadline(seconds: float) -> Deadline:
    clock = CLOCKS["cpu"]
    return Deadline(clock() + seconds, clock)


def test_the_exact_extremes_are_the_reference_they_claim():
    """The reference itself: the first layer's extremes are interval arithmetic's, exactly
    (an affine function of a box); every layer's hold 20,000 sampled values and come
    within 2% of their range (a region-cutting slip would leave a value outside or miss
    a region's extreme)."""
    net, lower, upper = small_net_and_box(0, 1.0)
    exact = extremes(net, lower, upper)
    weight, bias = net[0].weight.detach().double(), net[0].bias.detach().double()
    for i, (low, top) in enumerate(exact[0]):
        pairs = [
            [Fraction(float(weight[i, d])) * Fraction(float(end[d])) for end in (lower, upper)]
            for d in (0, 1)
        ]
        assert low == sum(min(p) for p in pairs) + Fraction(float(bias[i]))
        assert top == sum(max(p) for p in pairs) + Fraction(float(bias[i]))
    x = lower + (upper - lower) * torch.rand(20000, 2, dtype=torch.float64)
    h = x
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for layer, found in zip(linears[:-1], exact, strict=True):
        h = torch.nn.functional.linear(h, layer.weight.double(), layer.bias.double())
        low = torch.tensor([float(a) for a, _ in found], dtype=torch.float64)
        top = torch.tensor([float(t) for _, t in found], dtype=torch.float64)
        span = top - low
        assert (h.min(0).values >= low - 1e-12).all() and (h.max(0).values <= top + 1e-12).all()
        assert (h.min(0).values - low <= 0.02 * span).all()
        assert (top - h.max(0).values <= 0.02 * span).all()
        h = h.relu()


@pytest.mark.parametrize(("seed", "scale"), [(0, 1.0), (3, 1.0), (7, 1.0), (6, 3.0)])
def test_refined_boxes_hold_the_exact_extremes(seed, scale):
    """Every hidden pre-activation's refined box holds its exact min and max over the input
    box, and refinement tightened CROWN's boxes (the case under test)."""
    net, lower, upper = small_net_and_box(seed, scale)
    graph = build_graph(net, (2,), "small")
    crown = b.linear_boxes(graph, lower[None], upper[None])
    boxes, tightened = refine.refine_boxes(graph, crown, _cpu_deadline(60), 5.0)
    assert tightened
    nodes = [op.inputs[0] for op in graph.ops if op.kind == "activation"]
    moved = 0
    for j, exact in zip(nodes, extremes(net, lower, upper), strict=True):
        lo, hi = (t.flatten().tolist() for t in boxes[j])
        for u, (low, top) in enumerate(exact):
            assert Fraction(lo[u]) <= low and top <= Fraction(hi[u])
        moved += int((boxes[j][0] > crown[j][0]).sum() + (boxes[j][1] < crown[j][1]).sum())
    assert moved > 0


def test_refinement_says_whether_it_tightened_a_box(monkeypatch):
    """Where every MILP is unsolved, ``refine_boxes`` says it tightened nothing (where
    they tighten, the test above sees it say so). ``complete``'s note on a certificate
    on tightened boxes (``REFINED_NOTE``, which contains ``MIP_NOTE``) is checked by
    tests/test_alpha_open_samples.py's
    ``test_completes_refined_search_stops_early_once_the_rows_certify``, which runs that
    verify already (before, the certificate had no note)."""
    assert MIP_NOTE in REFINED_NOTE
    net, lower, upper = small_net_and_box(0, 1.0)
    graph = build_graph(net, (2,), "small")
    crown = b.linear_boxes(graph, lower[None], upper[None])
    unsolved = Solved(float("-inf"), float("inf"), None)
    monkeypatch.setattr(refine, "solve", lambda *args, **kwargs: unsolved)
    boxes, tightened = refine.refine_boxes(graph, crown, _cpu_deadline(60), 1.0)
    assert not tightened
    assert all(torch.equal(a, c) for box, old in zip(boxes, crown, strict=True)
               for a, c in zip(box, old, strict=True))  # fmt: skip
