"""Max-pooling's linear relaxation (ops.MaxPool.backward): below every sampled value, exact
when one element of each window always wins, equal to IBP on a lone max-pool, and inside
CROWN below every sampled output and tighter than IBP (issue 32: ResNet-50's stem)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aisafety.verification import bounds as b
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier, IBPVerifier
from aisafety.verification.property import robustness_property

POOLS = [
    nn.MaxPool2d(2),
    nn.MaxPool2d(3, 2, 1),  # ResNet's stem: overlapping windows, -inf padding
    nn.MaxPool2d(3, 2, 1, ceil_mode=True),
    nn.MaxPool2d(2, 1, dilation=2),
    nn.MaxPool2d((3, 2), (2, 1), (1, 0)),
]


def pool_graph(pool: nn.Module, side: int = 9):
    return build_graph(nn.Sequential(pool), (2, side, side), "pool", dtype=torch.float64)


def random_box(shape, generator, spread: float = 1.0):
    centre = torch.randn(*shape, generator=generator, dtype=torch.float64)
    radius = spread * torch.rand(*shape, generator=generator, dtype=torch.float64)
    return centre - radius, centre + radius


def samples(box, n: int, generator) -> torch.Tensor:
    """Uniform points of the box and as many of its corners."""
    lo, hi = box
    inside = lo + (hi - lo) * torch.rand(n, *lo.shape, generator=generator, dtype=lo.dtype)
    corner = torch.rand(n, *lo.shape, generator=generator, dtype=lo.dtype) < 0.5
    return torch.cat([inside, torch.where(corner, lo, hi)])


@pytest.mark.parametrize("pool", POOLS, ids=repr)
def test_the_relaxation_is_below_every_sampled_value(pool):
    g = torch.Generator().manual_seed(0)
    graph = pool_graph(pool)
    op = graph.ops[1]
    box = random_box((3, 2, 9, 9), g)
    a = torch.randn(3, 4, *op.out_shape, generator=g, dtype=torch.float64)
    (back,), bias = op.backward(a, box)
    for x in samples(box, 200, g):
        exact = (a * pool(x).unsqueeze(1)).flatten(2).sum(2)
        linear = (back * x.unsqueeze(1)).flatten(2).sum(2) + bias
        assert (linear <= exact + 1e-12).all()


@pytest.mark.parametrize("pool", POOLS, ids=repr)
def test_the_relaxation_is_exact_when_one_element_dominates_each_window(pool):
    g = torch.Generator().manual_seed(1)
    graph = pool_graph(pool)
    op = graph.ops[1]
    # element values far apart, tiny radii: each window's winner is certain
    centre = torch.randperm(2 * 81, generator=g).reshape(1, 2, 9, 9).double()
    box = (centre - 0.1, centre + 0.1)
    index, exact, _ = op.relaxation(box)
    assert exact.all()
    a = torch.randn(1, 3, *op.out_shape, generator=g, dtype=torch.float64)
    (back,), bias = op.backward(a, box)
    for x in samples(box, 20, g):
        value = (a * pool(x).unsqueeze(1)).flatten(2).sum(2)
        linear = (back * x.unsqueeze(1)).flatten(2).sum(2) + bias
        torch.testing.assert_close(linear, value, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pool", POOLS, ids=repr)
def test_on_a_lone_max_pool_the_bounds_are_ibps(pool):
    """Concretised on the box, the lower line gives the largest lower bound and the upper
    plane the largest upper bound: exactly IBP's box of a max-pool."""
    g = torch.Generator().manual_seed(2)
    graph = pool_graph(pool)
    op = graph.ops[1]
    box = random_box((2, 2, 9, 9), g, spread=0.3)  # some windows dominated, some not
    _, exact, _ = op.relaxation(box)
    assert exact.any() and not exact.all()
    rows = op.out_shape[0] * op.out_shape[1] * op.out_shape[2]
    eye = torch.eye(rows, dtype=torch.float64).expand(2, rows, rows)
    a = torch.cat([eye, -eye], 1).reshape(2, 2 * rows, *op.out_shape)
    (back,), bias = op.backward(a, box)
    bound = b.concretize(back, box) + bias
    lo, hi = op.interval(box)
    torch.testing.assert_close(bound[:, :rows], lo.flatten(1), rtol=0, atol=1e-12)
    torch.testing.assert_close(-bound[:, rows:], hi.flatten(1), rtol=0, atol=1e-12)


class FunctionalPool(nn.Module):
    """Conv-ReLU, F.max_pool2d(3, 2, 1), conv-ReLU, linear: max-pooling as a torch call."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 3, 3)
        self.head = nn.Linear(3 * 3 * 3, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 3, 2, 1)
        return self.head(F.relu(self.conv2(x)).flatten(1))


def pooled_nets():
    torch.manual_seed(0)
    for pool in POOLS:
        body = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), pool,
                             nn.Conv2d(4, 3, 3), nn.ReLU(), nn.Flatten())  # fmt: skip
        width = body(torch.zeros(1, 2, 9, 9)).shape[1]
        yield nn.Sequential(*body, nn.Linear(width, 5)).eval()
    yield FunctionalPool().eval()


@pytest.mark.parametrize("index", range(len(POOLS) + 1))
def test_crown_through_max_pooling_is_sound_and_tighter_than_ibp(index):
    net = list(pooled_nets())[index]
    graph = build_graph(net, (2, 9, 9), "pooled", dtype=torch.float64)
    net = net.double()
    g = torch.Generator().manual_seed(3)
    x = torch.rand(3, 2, 9, 9, generator=g, dtype=torch.float64)
    lo, hi = x - 0.05, x + 0.05
    spec = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    crown, _ = b.spec_lower(graph, b.linear_boxes(graph, lo, hi), spec)
    ibp = b.ibp_spec_lower(graph, b.interval_boxes(graph, lo, hi), spec)
    points = samples((lo, hi), 1000, g)
    outputs = net(points.flatten(0, 1)).reshape(points.shape[0], 3, 5)
    lowest = torch.einsum("bko,nbo->nbk", spec, outputs).amin(0)
    assert (crown <= lowest + 1e-9).all()
    assert (crown - ibp).mean() > 0  # the relaxation pays: tighter than IBP on average


def test_the_crown_verifiers_take_a_max_pooling_net():
    """CROWN and alpha-CROWN run on it (they refused max-pooling before), with margins at
    least IBP's, alpha-CROWN's at least CROWN's."""
    net = list(pooled_nets())[1]
    graph = build_graph(net, (2, 9, 9), "pooled")
    x = torch.rand(4, 2, 9, 9, generator=torch.Generator().manual_seed(4))
    prop = robustness_property(x, net(x).argmax(1), 0.01, 5)
    ibp, crown, alpha = (
        v.verify(graph, prop).margins
        for v in (IBPVerifier(), CrownVerifier(), AlphaCrownVerifier(steps=5))
    )
    assert (crown >= ibp).all() and (crown > ibp).any() and (alpha >= crown).all()
