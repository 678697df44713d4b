"""Sigmoid and tanh: the relaxation's lines for any slope, alpha-CROWN's slope search on
them, and what ``bab``/``complete`` answer on such networks (#33)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from aisafety.database.scaled_mlp import sshape_net
from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification.falsify import pgd_on_rows
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier
from aisafety.verification.relaxations import SIGMOID, TANH
from aisafety.verification.result import Verdict
from aisafety.verification.sshape_search import stalled as _stalled

FUNCTIONS = [(SIGMOID, torch.sigmoid), (TANH, torch.tanh)]


def intervals(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random [l, u]: tiny (down to 1e-12 wide) to huge (1e4 wide), all negative, all
    positive, mixed, far in the tails (|z| up to 1e3), and points."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(
        -2, 4, (n,), generator=g
    )
    width = 10.0 ** (torch.rand(n, generator=g, dtype=torch.float64) * 16 - 12)
    lower = centre - width * torch.rand(n, generator=g, dtype=torch.float64)
    upper = lower + width
    upper[: n // 20] = lower[: n // 20]  # points
    return lower, upper


def samples(lower: torch.Tensor, upper: torch.Tensor, m: int = 400) -> torch.Tensor:
    t = torch.linspace(0, 1, m, dtype=torch.float64)
    return lower.unsqueeze(-1) + (upper - lower).unsqueeze(-1) * t


def check_lines(fn, lines, lower, upper) -> tuple[torch.Tensor, torch.Tensor]:
    """Per interval, the least gap of f over the lower line and of the upper line over f
    on dense samples (float64: the lines' coefficients are exact there)."""
    lw, lb, uw, ub = (t.double() for t in lines)
    z = samples(lower.double(), upper.double())
    f = fn(z)
    below = f - (lw.unsqueeze(-1) * z + lb.unsqueeze(-1))
    above = (uw.unsqueeze(-1) * z + ub.unsqueeze(-1)) - f
    return below.amin(-1), above.amin(-1)


@pytest.mark.parametrize("rule", ["tangent", "chord"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("relaxation", "fn"), FUNCTIONS)
def test_crowns_lines_are_below_and_above_f_on_dense_samples_and_touch_it(
    relaxation, fn, dtype, rule
):
    """CROWN's default lines (``tangent_slopes``) and the chord's, on 3,000 intervals."""
    relaxation = dataclasses.replace(relaxation, rule=rule)
    lower, upper = intervals(3000, seed=1)
    lower, upper = lower.to(dtype), upper.to(dtype)
    below, above = check_lines(fn, relaxation.lines(lower, upper), lower, upper)
    assert (below >= 0).all() and (above >= 0).all()
    # the intercepts are the exact extremes: each line touches f, up to the 1e-7 margin and
    # the grid (on intervals up to 10 wide it passes within 0.0125 of the touching point,
    # where f'' <= 0.77 leaves a gap below 1e-4)
    narrow = (upper - lower).double() <= 10
    assert below[narrow].max() < 1e-4 and above[narrow].max() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("relaxation", "fn"), FUNCTIONS)
def test_any_searched_slope_gives_sound_lines_per_row(relaxation, fn, dtype):
    """alpha-CROWN's slopes (B, K, 2, n): positions in the range of f' and beyond it (a
    search's step before clamping); every row's lines stay sound."""
    lower, upper = intervals(600, seed=2)
    lower, upper = lower.reshape(3, 200).to(dtype), upper.reshape(3, 200).to(dtype)
    g = torch.Generator().manual_seed(3)
    alpha = (torch.rand(3, 4, 2, 200, generator=g) * 2 - 0.5).to(dtype)
    lines = relaxation.lines(lower, upper, alpha)
    assert all(t.shape == (3, 4, 200) and t.dtype == dtype for t in lines)
    wide = [t.expand(3, 4, 200) for t in (lower.unsqueeze(1), upper.unsqueeze(1))]
    below, above = check_lines(fn, lines, *wide)
    assert (below >= 0).all() and (above >= 0).all()


# auto_LiRPA a050a3d's ``BoundSigmoid``/``BoundTanh`` CROWN slopes (lower, upper) on these
# intervals: convex, concave, and across 0 with each of its cases (the chord where it does
# not cross f, the tangent through the far end, the middle's tangent); its tangent points
# lie on a 0.01 grid, rounded away from 0, so its slopes differ from the exact ones by <0.4%
REFERENCE_INTERVALS = ([-3.0, 1.0, -1.0, -0.5, -4.0, -6.0, -0.3, -2.5, 0.2],
                       [-1.0, 3.0, 2.0, 4.0, 0.5, 1.0, 0.4, 5.0, 0.3])  # fmt: skip
LIRPA_SLOPES = {
    "sigmoid": ([0.105, 0.1108, 0.2037, 0.1343, 0.1261, 0.0701, 0.2474, 0.125, 0.2461],
                [0.1108, 0.105, 0.235, 0.1261, 0.1343, 0.1041, 0.2485, 0.1731, 0.2461]),
    "tanh": ([0.0707, 0.1167, 0.5797, 0.3248, 0.1138, 0.0266, 0.9604, 0.2953, 0.9394],
             [0.1167, 0.0707, 0.7864, 0.1138, 0.3248, 0.2517, 0.9768, 0.2804, 0.94]),
}  # fmt: skip


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH])
def test_crowns_slopes_are_auto_lirpas(relaxation):
    lower, upper = (torch.tensor(v, dtype=torch.float64) for v in REFERENCE_INTERVALS)
    down, up = relaxation.tangent_slopes(lower, upper)
    want_down, want_up = (
        torch.tensor(v, dtype=torch.float64) for v in LIRPA_SLOPES[relaxation.name]
    )
    assert torch.allclose(down, want_down, rtol=4e-3, atol=1e-4)
    assert torch.allclose(up, want_up, rtol=4e-3, atol=1e-4)
    # by hand: on [-3, -1] (convex) the tangent at the middle below, the chord above
    assert down[0] == relaxation.derivative(torch.tensor(-2.0, dtype=torch.float64))
    assert up[0] == relaxation.chord(lower[:1], upper[:1])[0]


@pytest.mark.parametrize("relaxation", [SIGMOID, TANH])
def test_a_tangent_through_the_far_end_passes_through_it(relaxation):
    """Across 0, where neither the chord nor the middle's tangent is taken, the lower line
    is the tangent through (u, f(u)): with its exact intercept, it meets f there."""
    lower, upper = intervals(3000, seed=8)
    across = (lower < -0.1) & (upper > 0.1) & (upper - lower < 50)
    lower, upper = lower[across], upper[across]
    down, _ = relaxation.tangent_slopes(lower, upper)
    _, lb, _, _ = relaxation.lines(lower, upper)
    chord, mid = relaxation.chord(lower, upper), relaxation.derivative((lower + upper) / 2)
    tangent = (down != chord) & (down != mid)
    assert tangent.sum() > 50
    gap = relaxation.fn(upper) - (down * upper + lb)
    assert (gap[tangent] >= 0).all() and gap[tangent].max() < 1e-6


def test_the_initial_slopes_are_the_chords():
    lower, upper = intervals(500, seed=4)
    wide = upper - lower > 1e-3  # narrower, the chord's float64 quotient cancels (in tails)
    lower, upper = lower[wide].unsqueeze(0), upper[wide].unsqueeze(0)
    alpha = SIGMOID.initial_alpha(lower, upper).unsqueeze(1)  # (1, 1, 2, n)
    lw, _, uw, _ = SIGMOID.lines(lower, upper, alpha)
    chord = SIGMOID.chord(lower, upper)
    assert torch.allclose(lw[0, 0], chord, rtol=1e-4, atol=1e-15)
    assert torch.allclose(uw[0, 0], chord, rtol=1e-4, atol=1e-15)


def around(net: nn.Module, eps: float, n: int = 6):
    x = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        y = net(x).argmax(1)
    return x, robustness_property(x, y, eps, 3)


def sampled_minimum(net: nn.Module, x: torch.Tensor, prop) -> torch.Tensor:
    """Each sample's lowest spec rows (B, K) at ``x``, a PGD point and 2,000 uniform points
    of its box: at or above the true minimum, so a sound bound is below it. The points go
    through a float64 copy of the network, 50 points (of B images) per pass: the function
    the bounds are sound for, to float64's rounding (float32 passes of each point apart, as
    before session 21, differed from it by up to 4e-7 against a 1e-9 slack, and took 0.6 s
    a call on a residual CNN), and the uniform points stay in the box (no float32 cast)."""
    noise = torch.rand(2000, *x.shape, generator=torch.Generator().manual_seed(7))
    attacked = pgd_on_rows(lambda z: net(z), prop, steps=30)
    uniform = prop.lower + noise * (prop.upper - prop.lower)
    points = torch.cat([x[None].double(), attacked[None].double(), uniform.double()])
    net64 = copy.deepcopy(net).double()
    rows = []
    with torch.no_grad():
        for part in points.split(50):
            outputs = net64(part.flatten(0, 1)).unflatten(0, part.shape[:2])
            rows += [prop.rows(out) for out in outputs]
    return torch.stack(rows).amin(0)


def test_optimised_slopes_bound_below_samples_and_above_crown():
    net = sshape_net()
    graph = build_graph(net, (1, 4, 4), "sshape")
    x, prop = around(net, 0.1)
    prop64 = prop.to(graph.dtype)
    boxes = b.linear_boxes(graph, prop64.lower, prop64.upper)
    crown, _ = b.spec_lower(graph, boxes, prop64.spec)
    optimised, _ = b.optimise_slopes(graph, boxes, prop64.spec, 30, 0.1)
    alpha_boxes = b.linear_boxes(graph, prop64.lower, prop64.upper, "adaptive", 20)
    full, _ = b.optimise_slopes(graph, alpha_boxes, prop64.spec, 30, 0.1)
    true = sampled_minimum(net, x, prop)
    assert (crown <= true + 1e-9).all() and (optimised <= true + 1e-9).all()
    assert (full <= true + 1e-9).all()
    assert (optimised >= crown - 1e-9).all()  # CROWN's bound is kept where higher
    assert (optimised > crown + 1e-3).any()  # the search moves the sigmoid/tanh slopes


@pytest.mark.parametrize("name", ["bab", "complete"])
def test_bab_and_complete_answer_on_sigmoid_networks_without_contradiction(name):
    net = sshape_net()
    graph = build_graph(net, (1, 4, 4), "sshape")
    for eps in (0.02, 0.5):  # both certified by the bounds; one broken, one open
        # two samples: at 0.5 each further open sample only ran to its limit (0.5 s, 1 s
        # before: the verdicts 1 s gave, and 0.25 s too, measured)
        x, prop = around(net, eps, n=2)
        config = {"timeout": 0.5, "clock": "cpu", "root_steps": 20}
        result = make_verifier(default_registry(), name, config).verify(graph, prop, net)
        true = sampled_minimum(net, x, prop).amin(1)
        for s, verdict in enumerate(result.verdicts):
            if verdict is Verdict.CERTIFIED:
                assert true[s] > 0 and result.margins[s] <= true[s] + 1e-6
            if verdict is Verdict.FALSIFIED:
                with torch.no_grad():
                    point = result.counterexamples[s : s + 1]
                    assert prop[s : s + 1].rows(net(point).double()).min() <= 0
            if true[s] <= 0:
                assert verdict is not Verdict.CERTIFIED
        if eps == 0.02:
            assert Verdict.CERTIFIED in result.verdicts
        else:
            assert Verdict.FALSIFIED in result.verdicts


def test_stalled_means_no_open_row_closed_a_hundredth_of_its_gap():
    before = torch.tensor([-1.0, -0.5, 0.2])
    assert _stalled(before, torch.tensor([-0.995, -0.496, 0.9]))  # proved rows do not count
    assert not _stalled(before, torch.tensor([-0.98, -0.5, 0.2]))  # row 0 closed 2%


def test_bab_stops_its_slope_rounds_on_sigmoid_networks_once_they_stall():
    """An open sample whose rounds of slope search, then of sigmoid/tanh splits, stop
    gaining ends ``unknown`` with the note, long before a generous limit, its margin still
    below the sampled minimum (on the contract's sigmoid/tanh net the rounds used to run
    each sample's whole limit). Two samples: one open (~3.5 CPU s of rounds), one falsified;
    the other three open samples of ``around``'s six took the same path at 3-4.6 CPU s each."""
    net = sshape_net()
    graph = build_graph(net, (1, 4, 4), "sshape")
    x, prop = around(net, 0.5, n=2)
    config = {"timeout": 3600.0, "clock": "cpu", "root_steps": 20}
    verifier = make_verifier(default_registry(), "bab", config)
    result = verifier.verify(graph, prop, net)
    true = sampled_minimum(net, x, prop).amin(1)
    open_ = [s for s, v in enumerate(result.verdicts) if v is Verdict.UNKNOWN]
    assert open_, "no open sample: the test would check nothing"
    for s in open_:
        assert result.notes[s] == "not split further (stalled)"
        assert result.margins[s] <= true[s] + 1e-6
