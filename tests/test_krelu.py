"""K-ReLU: the group hull against an independent reference (the largest value of random
objectives over the hull = the largest over the 2^k pieces, each an LP of its own by
scipy), a closed-form net where the 2-ReLU hull is exact and the triangle LP is not, and
LP-Full <= K-ReLU <= the exact MILP (tests/test_orderings.py, the contract)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import Bounds, linprog, milp
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.milp import Encoding
from aisafety.verification.multi_neuron import Group, directions
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier


def hull_encoding(lower, upper, delta) -> Encoding:
    """Variables [z (k), a (k)] with only the group's hull rows on them."""
    k = len(lower)
    base = Encoding(2 * k, np.r_[lower, np.full(k, -np.inf)], np.r_[upper, np.full(k, np.inf)],
                    np.zeros(2 * k), [], [], [], np.eye(2 * k), np.zeros(2 * k), k)  # fmt: skip
    group = Group(np.eye(2 * k)[:, :k], np.zeros(k), np.arange(k, 2 * k), lower, upper, delta)
    return group.add_to(base)


def largest_over_pieces(objective, lower, upper, delta) -> float:
    """max objective . (z, relu(z)) over z in P: per orthant sigma, an LP in z alone."""
    k, s, best = len(lower), directions(len(lower)), -np.inf
    finite = np.isfinite(delta)
    for sigma in itertools.product((0.0, 1.0), repeat=k):
        cost = objective[:k] + objective[k:] * np.array(sigma)
        bounds = [(max(lo, 0.0), hi) if on else (lo, min(hi, 0.0))
                  for lo, hi, on in zip(lower, upper, sigma, strict=True)]  # fmt: skip
        if any(lo > hi for lo, hi in bounds):
            continue
        res = linprog(-cost, A_ub=s[finite], b_ub=delta[finite], bounds=bounds, method="highs")
        if res.status == 0:
            best = max(best, -res.fun)
    return best


@pytest.mark.parametrize("k, seed", [(2, 0), (2, 1), (3, 2), (3, 3)])
def test_the_group_hull_reaches_exactly_the_pieces_largest_values(k, seed):
    rng = np.random.default_rng(seed)
    lower, upper = -rng.uniform(0.5, 2, k), rng.uniform(0.5, 2, k)
    s = directions(k)
    # delta: the octahedral bounds of a random point cloud, so P is a real, cut polytope
    cloud = rng.uniform(lower, upper, (30, k)) * 0.9
    delta = (s @ cloud.T).max(1)
    lower, upper = cloud.min(0), cloud.max(0)
    enc = hull_encoding(lower, upper, delta)
    for _ in range(10):
        objective = rng.normal(size=2 * k)
        cost = np.zeros(enc.n_vars)
        cost[: 2 * k] = -objective  # no integrality: milp solves the LP
        found = milp(cost, constraints=enc.constraints(), bounds=Bounds(enc.lower, enc.upper))
        assert found.status == 0
        assert -found.fun == pytest.approx(largest_over_pieces(objective, lower, upper, delta),
                                           abs=1e-7)  # fmt: skip


def diamond_net(bias: float) -> nn.Module:
    """z = (x1' + x2', x1' - x2') with x' = 2x - 1 in [-1, 1]^2: the diamond |z1| + |z2| <= 2,
    which the octahedral bounds describe exactly; row f0 - f1 = bias - relu(z1) - relu(z2),
    whose minimum is bias - 2 (at x' = (1, 0)), while the triangles allow bias - 3."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[2.0, 2.0], [2.0, -2.0]]))
        net[0].bias.copy_(torch.tensor([-2.0, 0.0]))
        net[2].weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
        net[2].bias.copy_(torch.tensor([bias, 0.0]))
    return net.eval()


def test_on_the_diamond_the_two_relu_hull_is_exact_and_the_triangle_lp_is_not():
    net = diamond_net(2.5)
    graph = build_graph(net, (2,), "diamond")
    prop = robustness_property(torch.full((1, 2), 0.5), torch.tensor([0]), 0.5, 2)
    krelu = make_verifier(default_registry(), "k-relu", {"k": 2}).lower_bounds(graph, prop)[0]
    lp_full = make_verifier(default_registry(), "lp-full").lower_bounds(graph, prop)[0]
    assert float(krelu) == pytest.approx(0.5, abs=1e-4)  # 2.5 - 2: the exact minimum
    assert float(lp_full) == pytest.approx(-0.5, abs=1e-4)  # 2.5 - 3
    verdicts = make_verifier(default_registry(), "k-relu", {"k": 2}).verify(graph, prop).verdicts
    assert verdicts[0].value == "certified"


def test_the_lp_time_limit_on_the_cpu_clock_is_only_a_backstop():
    """HiGHS counts wall seconds: on a loaded machine a limit equal to the CPU seconds left
    stopped LPs early and loosened LP-Full and K-ReLU silently (sok-fcnn-b-adv1, load 18:
    K-ReLU 0.14 below LP-Full on a row). On the CPU clock the wall limit is 10x."""
    import time

    from aisafety.verification.deadline import CLOCKS, WALL_BACKSTOP, Deadline

    # bracketed by readings of each clock: a busy machine may pause this thread anywhere
    set_at = time.perf_counter()
    wall = Deadline(set_at + 5.0, CLOCKS["wall"])
    seconds = wall.wall_seconds()
    assert 5.0 - (time.perf_counter() - set_at) <= seconds <= 5.0
    set_at = time.process_time()
    cpu = Deadline(set_at + 5.0, CLOCKS["cpu"])
    seconds = cpu.wall_seconds() / WALL_BACKSTOP
    assert 5.0 - (time.process_time() - set_at) <= seconds <= 5.0
