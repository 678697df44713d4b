"""Float32 backward passes with a rounding margin (verification/rounding.py) stay sound:
below the float64 bound of the same relaxation on cases built to round badly, below sampled
values, and close to the float64 bound; the float32 ReLU chord stays above ReLU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.verification import bounds as b
from aisafety.verification import rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.relaxations import RELU


class Residual(nn.Module):
    """conv -> relu -> conv, plus the skip: the Add node and its summed coefficients."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


def badly_scaled_mlp(seed: int) -> nn.Module:
    """Large weights of both signs and a large offset: the float32 sums cancel a lot."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 64),
                        nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))  # fmt: skip
    with torch.no_grad():
        for layer in net:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_(300)
                layer.bias.add_(1e4)
    return net.eval()


def conv_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 3, 3, padding=1), Residual(), nn.ReLU(), nn.Conv2d(3, 6, 4, stride=2),
        nn.ReLU(), nn.Flatten(), nn.Linear(6 * 1 * 1, 5),
    ).eval()  # fmt: skip


def case(net: nn.Module, eps: float, n: int = 6, shape: tuple[int, ...] = (3, 4, 4)):
    graph = build_graph(net, shape, "rounding-case")
    x = torch.rand(n, *shape, generator=torch.Generator().manual_seed(0)) * 50
    with torch.no_grad():
        y = net(x).argmax(1)
    return graph, robustness_property(x, y, eps, 5).to(torch.float64)


def spec_bounds(graph, prop, precision: str) -> torch.Tensor:
    with rounding.pass_precision("float64"):  # the same boxes for both passes
        boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    with rounding.pass_precision(precision), torch.no_grad():
        return b.spec_lower(graph, boxes, prop.spec)[0]


def naive_float32(graph, prop) -> torch.Tensor:
    """The same pass in float32 without margins (what float32 bound propagation does)."""
    with rounding.pass_precision("float64"):
        boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    narrow = graph.in_dtype(torch.float32)
    boxes32 = [(lo.float(), hi.float()) for lo, hi in boxes]
    spec = prop.spec.float().reshape(*prop.spec.shape[:2], *graph.ops[-1].out_shape)
    with torch.no_grad():
        return b.backward(narrow, len(graph.ops) - 1, spec, boxes32)[0].double()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_bound_is_below_the_float64_bound_of_the_same_relaxation(seed):
    graph, prop = case(badly_scaled_mlp(seed), eps=0.5)
    exact = spec_bounds(graph, prop, "float64")
    rounded = spec_bounds(graph, prop, "float32")
    assert rounding.fast_graph(graph, 1 << 20) is not None  # the float32 path really ran
    assert (rounded <= exact).all(), float((rounded - exact).max())
    # the case rounds badly: float32 without margins is above the float64 bound somewhere
    assert (naive_float32(graph, prop) > exact).any()
    # and the margin costs little: a few float32 ulps of the terms, not of the bound
    assert (exact - rounded).max() <= 1e-3 * (1 + exact.abs().max())


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_passes_through_convolutions_and_residual_additions(seed):
    graph, prop = case(conv_net(seed), eps=2.0)
    exact = spec_bounds(graph, prop, "float64")
    rounded = spec_bounds(graph, prop, "float32")
    assert (rounded <= exact).all(), float((rounded - exact).max())
    assert (exact - rounded).max() <= 1e-4 * (1 + exact.abs().max())


class PooledNet(nn.Module):
    """An NHWC net's two input permutations, overlapping max-pooling (ResNet's stem: its
    coefficients summed where windows share an element) and non-overlapping (the Keras
    CNN's), with large weights and offsets so that the float32 sums cancel."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
            nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(6 * 2 * 2, 5),
        )  # fmt: skip
        with torch.no_grad():
            for layer in self.body:
                if isinstance(layer, nn.Conv2d | nn.Linear):
                    layer.weight.mul_(30)
                    layer.bias.add_(1e3)
        self.eval()

    def forward(self, x):
        return self.body(torch.permute(torch.permute(x, (0, 2, 3, 1)), (0, 3, 1, 2)))


def pooled_case(seed: int):
    net = PooledNet(seed)
    graph = build_graph(net, (3, 8, 8), "pooled-rounding")
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(seed)) * 50
    with torch.no_grad():
        y = net(x).argmax(1)
    return graph, robustness_property(x, y, 2.0, 5).to(torch.float64)


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_passes_through_max_pooling_and_permutations(seed):
    graph, prop = pooled_case(seed)
    assert {"maxpool", "positive-linear"} <= {op.kind for op in graph.ops}
    assert rounding.fast_graph(graph, 1 << 20) is not None  # the float32 path really runs
    exact = spec_bounds(graph, prop, "float64")
    rounded = spec_bounds(graph, prop, "float32")
    assert (rounded <= exact).all(), float((rounded - exact).max())
    # weights x30, offsets 1e3, inputs to 50: the terms dwarf the bound, and the convolutions'
    # margin of them is 5.3e-4 / 7.1e-5 of it (seeds 0 / 1); the overlapping pool's sums 1e-6
    assert (exact - rounded).max() <= 1e-3 * (1 + exact.abs().max())
    with rounding.pass_precision("float32"), torch.no_grad():
        bound = b.spec_lower(graph, b.linear_boxes(graph, prop.lower, prop.upper), prop.spec)[0]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(50):
        u = torch.rand(prop.lower.shape, generator=gen, dtype=torch.float64)
        point = prop.lower + u * (prop.upper - prop.lower)
        with torch.no_grad():
            values = torch.einsum("bko,bo->bk", prop.spec, graph.forward(point))
        assert (bound <= values).all()


def test_a_positive_linear_op_that_sums_keeps_the_float64_pass():
    """Average pooling rounds, and no margin here covers it: such a graph stays float64."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                        nn.Linear(4, 2)).eval()  # fmt: skip
    assert rounding.fast_graph(build_graph(net, (3, 4, 4), "avg"), 1 << 20) is None


def test_a_pass_that_starts_before_the_average_pooling_runs_in_float32_and_stays_sound():
    """Only the ops a pass crosses need a bounded rounding: the intermediate passes of a
    residual net that pools at its end run in float32 (50x auto_LiRPA's time in float64 on
    the benches' small-resnet), the final pass through the pool stays float64. The bound
    stays below the float64 one of the same relaxation and below sampled values."""
    torch.manual_seed(0)
    net = nn.Sequential(conv_net(0)[:3], nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5)).eval()  # fmt: skip
    graph = build_graph(net, (3, 4, 4), "pooled")
    x = torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    prop = robustness_property(x, net(x).argmax(1), 0.1, 5).to(torch.float64)
    pool = next(i for i, op in enumerate(graph.ops) if op.kind == "positive-linear")
    relus = [op.inputs[0] for op in graph.ops if op.kind == "activation"]
    assert rounding.fast_graph(graph, 1 << 20) is None  # the whole graph: not float32
    assert all(rounding.fast_graph(graph, 1 << 20, start=j) is not None for j in relus)
    assert rounding.fast_graph(graph, 1 << 20, start=pool) is None
    exact = spec_bounds(graph, prop, "float64")
    with rounding.pass_precision("float32"), torch.no_grad():
        bound = b.spec_lower(graph, b.linear_boxes(graph, prop.lower, prop.upper), prop.spec)[0]
    assert (bound <= exact).all() and not torch.equal(bound, exact)  # float32 boxes ran
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        u = torch.rand(prop.lower.shape, generator=gen, dtype=torch.float64)
        point = prop.lower + u * (prop.upper - prop.lower)
        with torch.no_grad():
            values = torch.einsum("bko,bo->bk", prop.spec, graph.forward(point))
        assert (bound <= values).all()


@pytest.mark.parametrize("make", [badly_scaled_mlp, conv_net])
def test_crown_in_float32_is_below_sampled_values(make):
    net = make(3)
    graph, prop = case(net, eps=0.5 if make is badly_scaled_mlp else 2.0)
    assert_float32_crown_below_samples(graph, prop)


def assert_float32_crown_below_samples(graph, prop) -> None:
    """CROWN with float32 passes is below ``C f`` at 20 points of every box (corners too)."""
    with rounding.pass_precision("float32"), torch.no_grad():
        bound = b.spec_lower(graph, b.linear_boxes(graph, prop.lower, prop.upper), prop.spec)[0]
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        u = torch.rand(prop.lower.shape, generator=gen, dtype=torch.float64)
        corner = torch.rand(prop.lower.shape, generator=gen) < 0.5  # corners are extreme
        point = torch.where(corner, prop.upper, prop.lower + u * (prop.upper - prop.lower))
        with torch.no_grad():
            values = torch.einsum("bko,bo->bk", prop.spec, graph.forward(point))
        assert (bound <= values).all()


def test_float32_relu_chord_stays_above_relu():
    gen = torch.Generator().manual_seed(0)
    scale = 10 ** torch.randint(-6, 6, (2, 100_000), generator=gen).float()
    lower = -torch.rand(100_000, generator=gen) * scale[0] - 1e-30
    upper = torch.rand(100_000, generator=gen) * scale[1] + 1e-30
    _, _, uw, ub = RELU.lines(lower, upper)
    lo, hi, w, c = lower.double(), upper.double(), uw.double(), ub.double()
    assert (w * lo + c >= 0).all()  # float32 products are exact in float64
    assert (w * hi + c >= hi).all()
    naive = (-uw * lower).double()  # the chord's intercept rounded to nearest
    assert ((w * hi + naive < hi) | (w * lo + naive < 0)).any()


def test_fast_path_only_where_float32_is_exact_and_sound():
    relu = build_graph(badly_scaled_mlp(0), (3, 4, 4), "relu")
    assert rounding.fast_graph(relu, 1 << 20) is not None
    assert rounding.fast_graph(relu, 10) is None  # small: float64 is as cheap
    sigmoid = build_graph(nn.Sequential(nn.Flatten(), nn.Linear(48, 4), nn.Sigmoid(),
                                        nn.Linear(4, 2)), (3, 4, 4), "sigmoid")  # fmt: skip
    assert rounding.fast_graph(sigmoid, 1 << 20) is None
    wide = build_graph(badly_scaled_mlp(0), (3, 4, 4), "float64 weights")
    dense = next(op for op in wide.ops if op.kind == "dense")
    dense.weight = dense.weight + 1e-12  # no longer float32 numbers
    assert rounding.fast_graph(wide, 1 << 20) is None
    with rounding.pass_precision("float64"):
        assert rounding.fast_graph(relu, 1 << 20) is None


def unstable_mlp(seed: int) -> nn.Module:
    """Weights of both signs at scale 300 and no offset: most ReLUs unstable, where the
    chord slopes round, and large |z| there (the ReLU margin's case)."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 96), nn.ReLU(), nn.Linear(96, 96),
                        nn.ReLU(), nn.Linear(96, 96), nn.ReLU(), nn.Linear(96, 5))  # fmt: skip
    with torch.no_grad():
        for layer in net:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_(300)
    return net.eval()


def test_relu_coefficients_round_only_on_unstable_neurons():
    """The premise of the ReLU margin over unstable neurons only: a stable neuron's slopes
    are 0 or 1, so its float32 coefficient is the exact product."""
    gen = torch.Generator().manual_seed(0)
    lower = torch.randn(4, 300, generator=gen) * 10
    upper = lower + torch.rand(4, 300, generator=gen) * 20
    a = torch.randn(4, 7, 300, generator=gen) * 1e3
    graph = build_graph(unstable_mlp(0), (3, 4, 4), "relu")
    relu = next(op for op in graph.in_dtype(torch.float32).ops if op.kind == "activation")
    (back,), _ = relu.backward(a, (lower, upper), constant=False)
    lw, _, uw, _ = RELU.lines(lower, upper)
    exact = torch.where(
        a > 0, a.double() * lw.double().unsqueeze(1), a.double() * uw.double().unsqueeze(1)
    )
    stable = ~((lower < 0) & (upper > 0)).unsqueeze(1).expand_as(a)
    assert stable.any() and (~stable).any()
    assert torch.equal(back.double()[stable], exact[stable])
    assert (back.double() != exact)[~stable].any()  # the unstable ones do round


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_bound_with_many_unstable_neurons_stays_below_exact_and_samples(seed):
    net = unstable_mlp(seed)
    graph, prop = case(net, eps=1.0)
    exact = spec_bounds(graph, prop, "float64")
    rounded = spec_bounds(graph, prop, "float32")
    assert rounding.fast_graph(graph, 1 << 20) is not None
    assert (rounded <= exact).all(), float((rounded - exact).max())
    assert (naive_float32(graph, prop) > exact).any()  # it rounds badly (by 196-442)
    assert (exact - rounded).max() <= 1e-3 * (1 + exact.abs().max())
    with rounding.pass_precision("float32"), torch.no_grad():
        bound = b.spec_lower(graph, b.linear_boxes(graph, prop.lower, prop.upper), prop.spec)[0]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(20):
        u = torch.rand(prop.lower.shape, generator=gen, dtype=torch.float64)
        corner = torch.rand(prop.lower.shape, generator=gen) < 0.5
        point = torch.where(corner, prop.upper, prop.lower + u * (prop.upper - prop.lower))
        with torch.no_grad():
            values = torch.einsum("bko,bo->bk", prop.spec, graph.forward(point))
        assert (bound <= values).all()


def test_final_pass_runs_in_float64_below_its_threshold():
    """``auto`` bounds the spec rows in float64 up to ``FINAL_SMALL`` coefficient elements:
    the same bound as float64 passes with the same boxes, bit for bit."""
    graph, prop = case(unstable_mlp(0), eps=1.0, n=256)
    with rounding.pass_precision("float32"):
        boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    rows = prop.spec.shape[0] * prop.spec.shape[1]
    assert rows * 96 >= rounding.SMALL  # an intermediate pass this size would be float32
    with torch.no_grad():
        auto = b.spec_lower(graph, boxes, prop.spec)[0]
        with rounding.pass_precision("float64"):
            wide = b.spec_lower(graph, boxes, prop.spec)[0]
        with rounding.pass_precision("float32"):
            narrow = b.spec_lower(graph, boxes, prop.spec)[0]
    assert torch.equal(auto, wide)
    assert (narrow <= wide).all() and (narrow < wide).any()


def test_each_row_counts_its_own_nonzero_terms_soundly():
    """Rows of 1 to 64 nonzero coefficients in one pass: each row's margin uses its own
    count (``rounding.gammas``), and every row stays below the float64 bound, on a badly
    scaled network where float32 without margins is above it somewhere."""
    graph, prop = case(badly_scaled_mlp(4), eps=0.5)
    with rounding.pass_precision("float64"):
        boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    start = max(
        i for i, op in enumerate(graph.ops) if op.kind == "dense" and i < len(graph.ops) - 1
    )
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(prop.lower.shape[0], 64, 64, generator=gen, dtype=torch.float64) * 1e3
    a = (a * (torch.arange(64).unsqueeze(1) >= torch.arange(64))).float().double()  # row k: k + 1
    with torch.no_grad():
        with rounding.pass_precision("float64"):
            exact = b.sound_backward(graph, start, a, boxes)[0]
        with rounding.pass_precision("float32"):
            rounded = b.sound_backward(graph, start, a, boxes)[0]
        naive = b.backward(graph.in_dtype(torch.float32), start, a.float(),
                           [(lo.float(), hi.float()) for lo, hi in boxes])[0].double()  # fmt: skip
    assert (rounded <= exact).all(), float((rounded - exact).max())
    assert (naive > exact).any()
    loss = exact - rounded  # a row of few terms loses less than a full one
    assert loss[:, :4].mean() < loss[:, -4:].mean()


def test_rows_float32_cannot_hold_stay_in_float64():
    """A spec row of 0.1 is not a float32 number: its float32 copy is another spec, so the
    pass must not run there (its bound would not be the asked spec's)."""
    graph, prop = case(badly_scaled_mlp(0), eps=0.5)
    spec = prop.spec * 0.1  # 0.1 * (+-1): not exact in float32
    assert not torch.equal(spec.float().double(), spec)
    with rounding.pass_precision("float64"):
        boxes = b.linear_boxes(graph, prop.lower, prop.upper)
    a = spec.reshape(*spec.shape[:2], *graph.ops[-1].out_shape)
    with torch.no_grad():
        wide = b.backward(graph, len(graph.ops) - 1, a, boxes)[0]
        with rounding.pass_precision("float32"):
            fallback = b.sound_backward(graph, len(graph.ops) - 1, a, boxes)[0]
            assert rounding.fast_graph(graph, 1 << 20) is not None  # float32 was allowed
    assert torch.equal(fallback, wide)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nonzero_counts_equal_counting_the_nonzero_elements(dtype):
    """``rounding.nonzero_counts`` (a sum of ``|sign|``) equals ``(a != 0).sum`` per row,
    with negative zeros (not counted), subnormals and infinities (counted) in the rows."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 40, 257, generator=gen).to(dtype)
    a[torch.rand(a.shape, generator=gen) < 0.6] = 0.0
    a[0, 0, :100] = -0.0
    a[1, 1, :5] = torch.finfo(dtype).tiny / 4  # subnormal
    a[2, 2, :3] = -torch.inf
    a[2, 3] = 0.0  # an all-zero row
    counts = rounding.nonzero_counts(a)
    assert torch.equal(counts.double(), (a != 0).sum(2).double())
    assert counts[0, 0] == (a[0, 0, 100:] != 0).sum() and counts[2, 3] == 0
