"""The bound that prunes a branch-and-bound domain is rounding-safe (#33).

``split_bounds.sound_split_bound`` runs the beta-CROWN pass in float32 with every rounding
error subtracted (``rounding.py``, as CROWN's ``bounds.sound_backward``), plus the float32
subtraction of ``beta s``. On badly scaled networks (weights x300, offsets 1e4, as
``test_rounding.py``), with random splits, slopes and multipliers, it is below the float64
bound of the same relaxation on every domain, while the same float32 pass without margins
is above it somewhere (so the margins are what keep it sound), and close to it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.verification import bounds as b
from aisafety.verification import rounding
from aisafety.verification import split_bounds as sb
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


def badly_scaled(conv: bool) -> nn.Module:
    torch.manual_seed(0)
    if conv:
        net = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), Residual(), nn.ReLU(),
                            nn.Conv2d(3, 6, 4, stride=2), nn.ReLU(), nn.Flatten(),
                            nn.Linear(6, 5))  # fmt: skip
    else:
        net = nn.Sequential(nn.Flatten(), nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 64),
                            nn.ReLU(), nn.Linear(64, 5))  # fmt: skip
    with torch.no_grad():
        for layer in net.modules():
            if isinstance(layer, nn.Linear | nn.Conv2d):
                layer.weight.mul_(300)
                layer.bias.add_(1e4)
    return net.eval()


def random_domains(graph, prop, n: int) -> tuple[sb.Domains, list]:
    """``n`` domains of the first sample's rows: random splits of its unstable ReLUs (each
    with probability 0.3), slopes in [0, 1] and multipliers in [0, 1]; and their boxes."""
    one = prop[0:1]
    with rounding.pass_precision("float64"):
        root = b.linear_boxes(graph, one.lower, one.upper)
    rows = torch.arange(one.spec.shape[1])
    dom = sb.root_domains(graph, root, one.spec[0], one.offset[0], rows)
    dom = sb.Domains.cat([dom] * (n // len(rows)))
    gen = torch.Generator().manual_seed(1)
    for i in sb.relu_nodes(graph):
        lo, hi = root[graph.ops[i].inputs[0]]
        unstable = ((lo < 0) & (hi > 0)).reshape(-1).to(torch.int8)
        sign = torch.randint(-1, 2, dom.splits[i].shape, generator=gen).to(torch.int8)
        keep = (torch.rand(dom.splits[i].shape, generator=gen) < 0.3).to(torch.int8)
        dom.splits[i] = sign * keep * unstable
        dom.alpha[i] = torch.rand(dom.alpha[i].shape, generator=gen)
        dom.beta[i] = torch.rand(dom.beta[i].shape, generator=gen)
    with rounding.pass_precision("float64"):
        return dom, sb.domain_boxes(graph, root, dom)


@pytest.mark.parametrize("conv", [False, True], ids=["mlp", "conv with a residual"])
def test_the_pruning_bound_is_below_the_float64_bound_of_the_same_relaxation(conv):
    graph = build_graph(badly_scaled(conv), (3, 4, 4), "rounding-case")
    x = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)) * 50
    with torch.no_grad():
        y = graph.forward(x.double()).argmax(1)
    prop = robustness_property(x, y, 0.5 if not conv else 2.0, 5).to(torch.float64)
    dom, boxes = random_domains(graph, prop, 400)
    wide = lambda d: {i: t.double() for i, t in d.items()}  # noqa: E731
    with torch.no_grad():
        exact = sb.split_backward(graph, dom, boxes, wide(dom.alpha), wide(dom.beta))[0]
        with rounding.pass_precision("float32"):
            assert rounding.fast_graph(graph, 1) is not None  # the float32 path really runs
            sound = sb.sound_split_bound(graph, dom, boxes, dom.alpha, dom.beta)[0]
        fast = graph.in_dtype(torch.float32)
        narrow = [(lo.float(), hi.float()) for lo, hi in boxes]
        plain = sb.Domains(dom.spec.float(), dom.offset.float(), dom.row, *narrow[0],
                           dom.splits, {}, {}, dom.bound)  # fmt: skip
        f32 = lambda d: {i: t.float() for i, t in d.items()}  # noqa: E731
        naive = sb.split_backward(fast, plain, narrow, f32(dom.alpha), f32(dom.beta))[0]
    assert (sound <= exact).all(), float((sound - exact).max())
    if not conv:  # the MLP rounds badly: float32 without margins is above float64 somewhere
        assert (naive.double() > exact).any()
    assert (exact - sound).max() <= 1e-3 * (1 + exact.abs().max())


@pytest.mark.parametrize("domains", [2, 3, 129, 669])
@pytest.mark.parametrize("n", [10, 256, 784])
def test_batched_dots_equal_the_per_sample_products_bit_for_bit(domains, n):
    # one row per domain, as branch and bound passes them; 669 x 784 is two chunks of 334
    # and one sample left over (it joins the last chunk), so the chunking is checked too
    gen = torch.Generator().manual_seed(domains * n)
    a = torch.randn(domains, 1, n, generator=gen)
    a[a.abs() < 0.5] = 0  # ReLU coefficients have zeros
    for signed_cols, absolute_cols in ((1, 2), (1, 1), (0, 1), (1, 0)):
        signed = torch.randn(domains, n, signed_cols, generator=gen, dtype=torch.float64)
        absolute = torch.rand(domains, n, absolute_cols, generator=gen, dtype=torch.float64)
        got, want = (
            rounding.dots(a, signed, absolute),
            rounding.per_sample_dots(a, signed, absolute),
        )
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("rows", [1, 3])
def test_row_dot_equals_one_matrix_vector_product_per_sample(rows):
    """``ops._row_dot`` (a ReLU's backward constant): one row per sample (branch and
    bound's domains) is one product and sum over the batch, not a gemv per sample; both
    paths equal the per-sample product (float64, to its rounding) and the exact sum
    (float64 integers: no rounding at all)."""
    from aisafety.verification.ops import _row_dot

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(130, rows, 8, 5, generator=gen, dtype=torch.float64)
    t = torch.randn(130, 8, 5, generator=gen, dtype=torch.float64)
    reference = torch.stack([torch.mv(a[i].flatten(1), t[i].flatten()) for i in range(130)])
    assert _row_dot(a, t).shape == (130, rows)
    assert torch.allclose(_row_dot(a, t), reference, rtol=1e-12, atol=1e-12)
    whole_a, whole_t = a.round(), t.round()  # integer products and sums are exact
    exact = (whole_a * whole_t.unsqueeze(1)).flatten(2).sum(2)
    assert torch.equal(_row_dot(whole_a, whole_t), exact)
