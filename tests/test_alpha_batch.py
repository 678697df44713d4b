"""An image's alpha-CROWN bound does not depend on the batch it is bounded in (#32):
the output search's early stop (layerwise and joint) is per sample, so a sample that
certifies early stops at the same step alone and beside samples that never certify or
stop later. Before, the stop waited for the whole batch, and a batch holding one
hopeless sample ran every step for all
(resnet_4b at 1/255, image 1: +0.0864 in a batch of 4 that all certify, +0.1075 in the
slow test's batch of 20). Nor does a pass's precision (float32 with rounding margins or
float64, chosen per sample since session 15) or how its spec rows are chunked, for CROWN
and alpha-CROWN (the last three tests)."""

from __future__ import annotations

import pytest
import torch

from aisafety.database.small_residual import small_residual
from aisafety.verification import bounds as b
from aisafety.verification import budget, rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier
from aisafety.verification.property import robustness_property
from tests.test_alpha_open_samples import _setup
from tests.test_sshape_relaxation import around, sampled_minimum

# float32 searches of different batch sizes sum in a different order: layerwise 4e-8
# measured. The joint search (14-24 Adam steps of float32 on a sigmoid net) carries a batch
# of 1's other arithmetic path far enough to move a sample's stop by one step (0.009 on
# main 07c78c1, whose concretize takes another path for one matrix), so there a sample's
# "alone" is the sample twice in a batch of 2: its stops are its own either way, and
# batches of 2 and 12 compute alike (measured: equal to 1e-7). Before the per-sample stop:
# 0.041 / 0.022 layerwise, 0.047 / 0.063 joint. Session 19 (after session 18's tie rule):
# the sample truly alone is within 4.5e-5 of its batch here (AMD EPYC, AVX-512 or
# ATEN_CPU_CAPABILITY=avx2), but 1.02e-3 under ATen's unvectorised path
# (ATEN_CPU_CAPABILITY=default: sshape 0.2, sample 7, open, all 20 steps), so "twice" stays
# the comparison: "alone" would depend on the CPU's vector path.
CLOSE = {False: 1e-6, True: 1e-3}


def _alone_and_batched(kind: str, eps: float, joint: bool = False, samples: int = 12):
    net, _, _, graph, _, _, _, _ = _setup(kind, eps)
    x, prop = around(net, eps, samples)
    p = prop.to(graph.dtype)
    verifier = AlphaCrownVerifier(steps=20, joint=joint)
    batched = verifier.bounds_and_boxes(graph, p).bound
    twice = [[i, i] if joint else [i] for i in range(len(p))]
    alone = torch.cat([verifier.bounds_and_boxes(graph, p[t]).bound[:1] for t in twice])
    return net, x, prop, p, batched, alone


@pytest.mark.parametrize(
    ("kind", "eps", "joint"),
    [("relu", 0.08, False), ("relu", 0.1, False), ("sshape", 0.17, True), ("sshape", 0.2, True)],
)
def test_a_samples_bound_is_the_same_alone_and_in_its_batch(kind, eps, joint):
    net, x, prop, p, batched, alone = _alone_and_batched(kind, eps, joint)
    certified = (batched + p.offset > 0).all(1)
    assert certified.any()  # the case under test: samples that stop early, at their own steps
    gap = (batched - alone).abs().max()
    assert gap <= CLOSE[joint], gap
    assert (batched + p.offset <= sampled_minimum(net, x, prop) + 1e-9).all()


def test_each_sample_stops_at_its_own_step(monkeypatch):
    """The output search on a mixed batch yields per-sample stops: a sample that leads
    early is due then (not at the last step), one that never leads only at the last."""
    _, _, _, graph, p, _, _, _ = _setup("relu", 0.1)
    boxes = AlphaCrownVerifier(steps=20, joint=False).boxes(graph, p)
    a = p.spec.reshape(*p.spec.shape[:2], *graph.ops[-1].out_shape)
    stops = []
    for stop in b.slope_stops(graph, len(graph.ops) - 1, a, boxes, 20, 0.1, offset=p.offset):
        stops.append((stop.steps, stop.due.clone()))
        stop.certified = torch.ones_like(stop.due)  # every due sample leaves
    first = {}
    for steps, due in stops:
        for i in due.nonzero().flatten().tolist():
            assert i not in first  # a sample that left is never due again
            first[i] = steps
    assert set(first) == set(range(len(p)))
    assert min(first.values()) < 20 and max(first.values()) == 20


def _residual_case():
    """The small residual conv net (3x16x16, float32 weights) at eps 0.03, 4 images: its
    CROWN passes run in float32 with rounding margins or in float64 by their size."""
    net = small_residual(8)
    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = net(x).argmax(1)
    graph = build_graph(net, (3, 16, 16), "residual")
    return net, x, robustness_property(x, y, 0.03, 10), graph


# fits one sample's spec rows (alpha-CROWN: 3.8 MB with the batch's boxes), not 4 samples'
SMALL_BUDGET = 1 << 22


def _crown(graph, p):
    with torch.no_grad():
        return CrownVerifier().lower_bounds(graph, p)[0]


def _alpha(graph, p):
    return AlphaCrownVerifier(steps=5).bounds_and_boxes(graph, p).bound


@pytest.mark.parametrize(("bound", "close"), [(_crown, 1e-12), (_alpha, 1e-9)])
def test_a_pass_precision_follows_the_sample_not_its_batch(bound, close):
    """Each pass runs in float32 (rounding margins) or float64 by the sample's own rows
    at that node, never the batch's: before, a batch of 4 took float32 where an image
    alone took float64 (CROWN 2.0e-6 and alpha-CROWN 1.9e-6 apart). CROWN's rows are
    independent, so chunks forced by a small budget change no bound either."""
    net, x, prop, graph = _residual_case()
    p = prop.to(graph.dtype)
    batched = bound(graph, p)
    alone = torch.cat([bound(graph, p[[i]]) for i in range(len(p))])
    assert (batched - alone).abs().max() <= close
    if bound is _crown:
        with budget.memory_limit(SMALL_BUDGET):
            assert (bound(graph, p) - alone).abs().max() <= close
    with rounding.pass_precision("float64"):
        exact = bound(graph, p)
    assert (exact - batched).abs().max() > 1e-9  # the case: float32 passes ran
    assert (batched + p.offset <= sampled_minimum(net, x, prop) + 1e-9).all()


def test_a_samples_spec_rows_are_chunked_as_if_alone():
    """Under a budget that fits one sample's 9 spec rows beside the batch's boxes but not
    4 samples' (``SMALL_BUDGET``), the output search takes the samples one at a time with
    all their rows; before, the rows were chunked for the batch (2 at a time), so each
    chunk stopped early on its own and the bounds moved with the batch (by 4.6e-3)."""
    _, _, prop, graph = _residual_case()
    p = prop.to(graph.dtype)
    boxes = AlphaCrownVerifier(steps=5).boxes(graph, p)
    search = lambda q, part: b.optimise_slopes(graph, part, q.spec, 5, 0.1, q.offset)[0]  # noqa: E731
    whole = search(p, boxes)
    with budget.memory_limit(SMALL_BUDGET):
        batched = search(p, boxes)
        alone = torch.cat([search(p[[i]], [(lo[[i]], hi[[i]]) for lo, hi in boxes])
                           for i in range(len(p))])  # fmt: skip
    assert (batched - alone).abs().max() <= 1e-9
    assert (batched - whole).abs().max() <= 1e-9
