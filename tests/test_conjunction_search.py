"""The joint search over a conjunction's atoms (``conjunction_search.py``, #33).

Soundness against an independent reference: the exact minimum of max_k row_k, an MILP
written here (the network's MILP from ``milp.encode``/``with_splits`` plus one variable
t >= row_k for every atom, minimised by HiGHS to optimality). Every pruned domain's
objective (the max over its atoms' bounds) is at most that minimum over the domain, for
ReLU splits and for input splits; the margin is at most the minimum over the box; an
``unsat`` is replayed at sampled points and corners (every one has max_k row_k > 0) and
agrees with the MILP; a ``sat`` point satisfies every atom.

The instances: small random MLPs, "class t is the largest" (atoms ``Y_j - Y_t <= 0``, the
Marabou properties' shape) around a random point, with radii where the root bound of no
atom is > 0, so pruning needs splits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from max_row_milp import with_max_row
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.conjunction_search import ConjunctionSearch, all_hold
from aisafety.verification.deadline import CLOCKS, Deadline
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import build_graph
from aisafety.verification.milp import Encoding, encode, solve, with_splits
from aisafety.verification.property import Property
from aisafety.verification.registry import make_verifier

OUTPUTS = 5


def mlp(inputs: int, seed: int, hidden: int = 24) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, OUTPUTS)).eval()  # fmt: skip


def target_is_largest(x: torch.Tensor, t: int, eps: float) -> Property:
    """The box x +- eps and the K = OUTPUTS - 1 atoms ``Y_j - Y_t <= 0`` (j != t)."""
    others = [j for j in range(OUTPUTS) if j != t]
    spec = torch.zeros(1, len(others), OUTPUTS, dtype=torch.float64)
    for k, j in enumerate(others):
        spec[0, k, j], spec[0, k, t] = 1.0, -1.0
    offset = torch.zeros(1, len(others), dtype=torch.float64)
    return Property((x - eps).double(), (x + eps).double(), spec, offset)


def point_below(enc: Encoding, spec: np.ndarray, offset: np.ndarray, value: float) -> bool:
    """Whether some point of the encoding has max_k (spec_k . f + offset_k) < ``value``,
    decided exactly by HiGHS: min t over the encoding with one more variable t and a row
    t - row_k >= 0 per atom (testkit's ``with_max_row``), searched only below ``value``
    (``milp.solve``'s cutoff: no point there proves the minimum >= ``value``; 100x faster
    than the optimum to a 1e-9 gap, 1.2 s a domain here)."""
    big = 1e4  # |row| is far below this on these nets
    with_t, cost = with_max_row(enc, spec, offset, -big, big)
    found = solve(with_t, cost, 0.0, 60.0, cutoff=value)
    return found.point is not None and found.value < value


def search(net: nn.Module, shape, prop: Property, config: dict, seconds: float = 30.0):
    """The joint search on one instance from alpha-CROWN's root: (its outcome, the search,
    every pruned domain, the root boxes, the graph)."""
    graph = build_graph(net, shape, "mlp")
    verifier = make_verifier(default_registry(), "bab", {"clock": "cpu", **config})
    one = prop.to(graph.dtype)
    with torch.no_grad():
        bound, _, boxes, _ = verifier.bounds_and_boxes(graph, one)
    first = added_down(bound, one.offset)[0]
    model = lambda x: graph.forward(x.to(graph.dtype))  # noqa: E731
    leaves = []
    deadline = Deadline(CLOCKS["cpu"]() + seconds, CLOCKS["cpu"])
    found = ConjunctionSearch(verifier.config, graph, one, boxes, model, deadline, leaves.append)
    return found.run(first), found, leaves, boxes, graph


def check_pruned(graph, boxes, prop: Property, leaves, atoms: int, most: int) -> int:
    """Up to ``most`` pruned domains: each one's objective > 0, and no point of the domain
    has max_k row_k below it (HiGHS, within 1e-7)."""
    spec, offset = prop.spec[0].numpy(), prop.offset[0].numpy()
    checked = 0
    for part in leaves:
        for first in range(0, len(part), atoms):
            if checked == most:
                return checked
            splits = {i: t[first].numpy() for i, t in part.splits.items()}
            own = [(part.lower[first : first + 1], part.upper[first : first + 1])]
            enc = with_splits(graph, own + list(boxes[1:]), splits)
            objective = float(part.bound[first : first + atoms].max())
            assert torch.equal(part.row[first : first + atoms], torch.arange(atoms))
            assert objective > 0 and not point_below(enc, spec, offset, objective - 1e-7)
            checked += 1
    return checked


def whole_box_below(graph, boxes, prop: Property, value: float) -> bool:
    """Whether some point of the box has max_k row_k < ``value`` (HiGHS)."""
    spec, offset = prop.spec[0].numpy(), prop.offset[0].numpy()
    return point_below(encode(graph, boxes), spec, offset, value)


RELU_CASES = [(0, 2, 0.25), (2, 1, 0.25), (1, 0, 0.4), (3, 0, 0.4)]  # seed, target, eps


def relu_instance(seed: int, t: int, eps: float):
    x = torch.rand(1, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    return mlp(16, seed), target_is_largest(x, t, eps)


@pytest.mark.parametrize("branching", ["babsr", "fsb"])
def test_every_domain_pruned_by_relu_splits_is_below_the_exact_min_max(branching):
    checked = split = 0
    for seed, t, eps in RELU_CASES:
        net, prop = relu_instance(seed, t, eps)
        config = {"domain_batch": 8, "branching": branching}
        outcome, found, leaves, boxes, graph = search(net, (1, 4, 4), prop, config)
        assert outcome.point is None and not outcome.why and outcome.margin > 0  # unsat
        # a lower bound of the minimum: no point below it
        assert not whole_box_below(graph, boxes, prop, outcome.margin - 1e-7)
        checked += check_pruned(graph, boxes, prop, leaves, found.atoms, 6)
        split += sum(any((s[::found.atoms] != 0).any() for s in leaf.splits.values())
                     for leaf in leaves)  # fmt: skip
    assert split >= 4 and checked >= 16  # pruning needed splits: the check checked something


def test_input_splits_prune_only_below_the_exact_min_max():
    """Two inputs: the input box is split (``input_split_max``)."""
    net, checked = mlp(2, 7, hidden=16), 0
    for t, eps in ((4, 0.2), (4, 0.3), (4, 0.5), (1, 0.3)):
        prop = target_is_largest(torch.full((1, 1, 2), 0.5), t, eps)
        outcome, found, leaves, boxes, graph = search(net, (1, 2), prop, {"domain_batch": 8})
        if outcome.point is None:  # every one settles: unsat, or sat where the MILP has one
            assert not outcome.why and outcome.margin > 0
            assert not whole_box_below(graph, boxes, prop, outcome.margin - 1e-7)
        else:
            assert whole_box_below(graph, boxes, prop, 0.0)
        checked += check_pruned(graph, boxes, prop, leaves, found.atoms, 6)
    assert checked >= 12


def sampled_max_rows(net: nn.Module, prop: Property, n: int = 20_000) -> torch.Tensor:
    """max_k row_k at the centre, n uniform points and n random corners of the box."""
    g = torch.Generator().manual_seed(11)
    lower, upper = prop.lower.float(), prop.upper.float()
    u = torch.rand(n, *lower.shape[1:], generator=g)
    corners = torch.randint(0, 2, (n, *lower.shape[1:]), generator=g).float()
    x = torch.cat([(lower + upper) / 2, lower + u * (upper - lower),
                   lower + corners * (upper - lower)])  # fmt: skip
    with torch.no_grad():
        return prop.rows(net(x).double()).amax(1)


def test_an_unsat_holds_at_every_sampled_point_and_a_sat_point_satisfies_every_atom():
    settled = {"unsat": 0, "sat": 0}
    for seed, t, eps in [*RELU_CASES, (0, 2, 0.4), (1, 1, 0.25)]:
        net, prop = relu_instance(seed, t, eps)
        outcome, *_, graph = search(net, (1, 4, 4), prop, {"domain_batch": 8}, seconds=8.0)
        if outcome.point is not None:
            assert bool(all_hold(net, prop, outcome.point).all())
            settled["sat"] += 1
        elif not outcome.why:
            assert outcome.margin > 0
            assert float(sampled_max_rows(net, prop).min()) > 0
            settled["unsat"] += 1
    assert settled == {"unsat": 4, "sat": 2}
