"""LP-Full against an independently written triangle LP solved by scipy's ``linprog``, and
the orderings CROWN, Fast-Lin, CROWN-IBP <= LP-Full <= the exact MILP optimum per row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.milp import encode, minimise_row
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier


def mlp() -> nn.Sequential:
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 10), nn.ReLU(),
                        nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))  # fmt: skip
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(2.0)
    return net.eval()


def problem(n: int = 4, eps: float = 0.15):
    net = mlp()
    x = torch.rand(n, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        y = net(x.float()).argmax(1)
    return net, build_graph(net, (6,), "mlp"), robustness_property(x, y, eps, 3)


def bounds_of(name: str, graph, prop) -> torch.Tensor:
    with torch.no_grad():
        return make_verifier(default_registry(), name).lower_bounds(graph, prop)[0]


def triangle_lp(layers, lower, upper, boxes, objective) -> float:
    """min ``objective . z_last`` over the triangle relaxation, written from the paper (not
    from ``milp.encode``): variables [x, z_1, a_1, ..., z_L], z_k = W_k a_{k-1} + b_k, and per
    hidden neuron with bounds [l, u]: a = 0 if u <= 0, a = z if l >= 0, else a >= 0,
    a >= z, a <= u (z - l) / (u - l)."""
    sizes = [len(lower)] + [w.shape[0] for w, _ in layers]
    starts = np.cumsum([0] + [sizes[0]] + [2 * s for s in sizes[1:-1]] + [sizes[-1]])
    n = starts[-1]
    bounds = [(lo, hi) for lo, hi in zip(lower, upper, strict=True)] + [(None, None)] * (
        n - sizes[0]
    )
    eq, eq_b, ub, ub_b = [], [], [], []
    prev = np.arange(starts[0], starts[1])  # the input
    for k, (w, bias) in enumerate(layers):
        z = np.arange(starts[k + 1], starts[k + 1] + w.shape[0])
        for i in range(w.shape[0]):
            row = np.zeros(n)
            row[z[i]], row[prev] = 1.0, -w[i]
            eq.append(row)
            eq_b.append(bias[i])
        if k == len(layers) - 1:
            cost = np.zeros(n)
            cost[z] = objective
            res = linprog(cost, A_ub=np.array(ub) if ub else None, b_ub=ub_b or None,
                          A_eq=np.array(eq), b_eq=eq_b, bounds=bounds, method="highs")  # fmt: skip
            assert res.status == 0, res.message
            return float(res.fun)
        a = z + w.shape[0]
        lo, hi = boxes[k]
        for i in range(w.shape[0]):
            if hi[i] <= 0:
                bounds[a[i]] = (0.0, 0.0)
            elif lo[i] >= 0:
                row = np.zeros(n)
                row[a[i]], row[z[i]] = 1.0, -1.0
                eq.append(row)
                eq_b.append(0.0)
            else:
                bounds[a[i]] = (0.0, None)
                above = np.zeros(n)  # z - a <= 0
                above[z[i]], above[a[i]] = 1.0, -1.0
                chord = np.zeros(n)  # a - s z <= -s l
                slope = hi[i] / (hi[i] - lo[i])
                chord[a[i]], chord[z[i]] = 1.0, -slope
                ub += [above, chord]
                ub_b += [0.0, -slope * lo[i]]
        prev = a
    raise AssertionError("no output layer")


def reference_lp_full(net: nn.Sequential, lower: np.ndarray, upper: np.ndarray, row: np.ndarray):
    """LP-Full by ``triangle_lp``: every hidden neuron's bounds by two LPs, layer by layer
    from the input box (no CROWN, no IBP), then the spec row."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    layers = [
        (m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in linears
    ]
    boxes = []
    for k in range(len(layers) - 1):
        head = layers[: k + 1]
        lo = [triangle_lp(head, lower, upper, boxes, e) for e in np.eye(layers[k][0].shape[0])]
        hi = [-triangle_lp(head, lower, upper, boxes, -e) for e in np.eye(layers[k][0].shape[0])]
        boxes.append((np.array(lo), np.array(hi)))
    return triangle_lp(layers, lower, upper, boxes, row @ np.eye(layers[-1][0].shape[0]))


def test_lp_full_equals_an_independent_triangle_lp_by_scipy_linprog():
    net, graph, prop = problem()
    found = bounds_of("lp-full", graph, prop)
    crown = bounds_of("crown", graph, prop)
    assert (found > crown + 1e-3).any()  # the case is not one where every bound coincides
    for s in range(len(prop)):
        lower, upper = (t[s].numpy() for t in (prop.lower, prop.upper))
        for k, row in enumerate(prop.spec[s].numpy()):
            reference = reference_lp_full(net, lower, upper, row)
            assert found[s, k].item() == pytest.approx(reference, abs=1e-4, rel=1e-4), (s, k)


def test_lp_full_is_between_crown_fast_lin_crown_ibp_and_the_exact_milp_per_row():
    _, graph, prop = problem(n=6, eps=0.1)
    lp_full = bounds_of("lp-full", graph, prop)
    for name in ("crown", "fast-lin", "crown-ibp", "ibp"):
        theirs = bounds_of(name, graph, prop)
        assert (theirs <= lp_full + 1e-4 * (1 + lp_full.abs())).all(), name
    boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    for s in range(len(prop)):
        enc = encode(graph, [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in boxes])
        for k, row in enumerate(prop.spec[s].numpy()):
            exact, value, _ = minimise_row(enc, row, 0.0, 30.0)
            assert exact == pytest.approx(value, abs=1e-6)  # solved to optimality
            assert lp_full[s, k] <= exact + 1e-6, (s, k)


@pytest.mark.parametrize("name", ["lp-full", "k-relu"])  # k-relu's named lp-full before
def test_lp_full_names_a_network_it_cannot_bound(name):
    net = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))
    with pytest.raises(VerificationError, match=f"'{name}' needs a ReLU network.*'sig'"):
        make_verifier(default_registry(), name).check(build_graph(net, (4,), "sig"))
