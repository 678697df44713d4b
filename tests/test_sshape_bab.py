"""Branch and bound over sigmoid and tanh neurons (``sshape_split.py``, ``bab``): the
children's lines, their boxes and bounds against sampled points that satisfy their cuts,
and ``bab``'s verdicts against sampled minima and box-PGD (#33)."""

from __future__ import annotations

import torch

from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification import sshape_split as ss
from aisafety.verification.graph import build_graph
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import Verdict
from tests.test_sshape_relaxation import around, check_lines, sampled_minimum, sshape_net


def node_values(graph, x: torch.Tensor) -> list[torch.Tensor]:
    """Every node's value at the points ``x`` (N, *in), in the graph's order."""
    values = [x.to(graph.dtype)]
    with torch.no_grad():
        for op in graph.ops[1:]:
            values.append(op.forward(*(values[i] for i in op.inputs)))
    return values


def split_tree(graph, prop, depth: int, batch: int = 4):
    """Domains of the first sample's open rows after ``depth`` rounds of splitting (each
    round: bound, choose, split the ``batch`` first), with every domain's cuts as a list of
    (node, index, low, high)."""
    p = prop[0:1].to(graph.dtype)
    root = b.linear_boxes(graph, p.lower, p.upper)
    d = ss.root_sdomains(root, p.spec[0], p.offset[0], torch.arange(p.spec.shape[1]))
    cuts = [[] for _ in range(len(d))]
    for _ in range(depth):
        bound, _, at = ss.bound_sdomains(graph, d, 5, 0.1)
        d.bound = torch.maximum(d.bound, bound)
        node, index, _ = ss.branch_scores(graph, d, at)
        pick = torch.nonzero(node >= 0).flatten()[:batch]
        d, node, index = d.take(pick), node[pick], index[pick]
        d.branch = torch.stack([node, index], 1)
        kids = ss.split_sdomains(graph, d)
        n = len(d)
        new_cuts = []
        for k in range(2 * n):
            j = graph.ops[int(node[k % n])].inputs[0]
            at_ = int(index[k % n])
            lo = float(kids.boxes[j][0][k].flatten()[at_])
            hi = float(kids.boxes[j][1][k].flatten()[at_])
            new_cuts.append([*cuts[pick[k % n]], (j, at_, lo, hi)])
        d, cuts = kids, new_cuts
    bound, _, _ = ss.bound_sdomains(graph, d, 5, 0.1)
    return p, d, torch.maximum(d.bound, bound), cuts


def test_children_cover_the_parent_at_the_split_point():
    lo = torch.tensor([-2.0, 0.5, -3.0, -1.0], dtype=torch.float64)
    hi = torch.tensor([1.0, 2.5, -1.0, 1e-9], dtype=torch.float64)
    t = ss.split_point(lo, hi)
    assert t.tolist() == [0.0, 1.5, -2.0, 0.0]
    assert ((lo <= t) & (t <= hi)).all()


def test_every_childs_lines_are_below_and_above_f_on_its_cut_interval():
    net = sshape_net()
    graph = build_graph(net, (1, 4, 4), "sshape")
    _, prop = around(net, 0.3)
    _, d, _, _ = split_tree(graph, prop, 3)
    g = torch.Generator().manual_seed(11)
    for i in ss.sshape_nodes(graph):
        op = graph.ops[i]
        lo, hi = (t.reshape(len(d), -1) for t in d.boxes[op.inputs[0]])
        for alpha in (None, torch.rand(len(d), 1, 2, lo.shape[1], generator=g, dtype=lo.dtype)):
            lines = op.relaxation.lines(lo, hi, alpha)
            wide = (lo, hi) if alpha is None else (lo.unsqueeze(1), hi.unsqueeze(1))
            below, above = check_lines(op.fn, lines, *wide)
            assert (below >= 0).all() and (above >= 0).all()


def test_domain_boxes_and_bounds_hold_at_every_sampled_point_that_satisfies_the_cuts():
    """Thousands of points of the box; those inside a domain's cuts have every node value in
    the domain's boxes and every row above the domain's bound."""
    net = sshape_net()
    graph = build_graph(net, (1, 4, 4), "sshape")
    _, prop = around(net, 0.3)
    p, d, bound, cuts = split_tree(graph, prop, 3)
    assert len(d) >= 8 and all(len(c) == 3 for c in cuts)
    noise = torch.rand(20000, 1, 4, 4, generator=torch.Generator().manual_seed(12))
    x = p.lower + noise.double() * (p.upper - p.lower)
    values = node_values(graph, x)
    rows = torch.einsum("ko,no->nk", p.spec[0], values[-1].double()) + p.offset[0]
    checked = 0
    for k in range(len(d)):
        inside = torch.ones(len(x), dtype=torch.bool)
        for j, at, lo, hi in cuts[k]:
            z = values[j].reshape(len(x), -1)[:, at]
            inside &= (z >= lo) & (z <= hi)
        if not inside.any():
            continue
        checked += int(inside.sum())
        for (lo, hi), v in zip(d.boxes, values, strict=True):
            v = v[inside].reshape(int(inside.sum()), -1)
            assert (v >= lo[k].reshape(1, -1) - 1e-12).all()
            assert (v <= hi[k].reshape(1, -1) + 1e-12).all()
        assert (rows[inside, d.row[k]] >= bound[k]).all()
    assert checked > 1000


def test_splits_tighten_the_bound_of_some_domain():
    net = sshape_net()
    graph = build_graph(net, (1, 4, 4), "sshape")
    _, prop = around(net, 0.3)
    _, d0, bound0, _ = split_tree(graph, prop, 0)
    _, d, bound, _ = split_tree(graph, prop, 3)
    worst = {int(r): float(bound0[d0.row == r].min()) for r in d0.row}
    assert any(float(bound[k]) > worst[int(d.row[k])] + 1e-3 for k in range(len(d)))


def test_bab_on_sigmoid_nets_is_below_the_sampled_minimum_and_never_certifies_a_broken_one():
    """bab's margins stay <= the sampled minimum (2,000 points and PGD) per sample, and
    never ``certified`` where the sampled minimum (box-PGD included) is <= 0."""
    net = sshape_net()
    graph = build_graph(net, (1, 4, 4), "sshape")
    seen = set()
    for eps in (0.05, 0.2):
        # three samples: at 0.05 sample 2 has the six's least gap to its sampled minimum
        # (0.032), at 0.2 two open ones (the other three ran to their 1 s limits) and one certified;
        # the open ones run to the limit: 0.5 s (1 s before) gives the same verdicts, 0.25 s too
        x, prop = around(net, eps, n=3)
        config = {"timeout": 0.5, "clock": "cpu", "root_steps": 20}
        result = make_verifier(default_registry(), "bab", config).verify(graph, prop, net)
        true = sampled_minimum(net, x, prop).amin(1)
        for s, verdict in enumerate(result.verdicts):
            seen.add(verdict)
            assert result.margins[s] <= true[s] + 1e-6
            if true[s] <= 0:
                assert verdict is not Verdict.CERTIFIED
    assert Verdict.CERTIFIED in seen
