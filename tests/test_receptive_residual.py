"""Receptive-field crops through residual additions (``verification/receptive.py``).

A node read by both branches of a residual block holds the union of their windows; the
branch that reads less of it reads a sub-window (``ops.Window``, a copy). Checked on small
residual nets (identity and 1x1-convolution shortcuts, the shortcut added first or second,
stride 2, padded convolutions at the image border, the shortcut from the input itself):
every neuron's cropped bound against the dense pass's on the same boxes, row by row, and
the boxes against sampled values.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aisafety.prediction.torch_module import Normalize
from aisafety.verification import bounds as b
from aisafety.verification import float64_margin, ops, receptive, rounding, search_plan
from aisafety.verification.graph import build_graph


class Block(nn.Module):
    """``relu(branch(x) + shortcut(x))``, or the shortcut added first (``swap``)."""

    def __init__(self, cin: int, cout: int, stride: int, swap: bool):
        super().__init__()
        self.branch = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1),
        )  # fmt: skip
        self.shortcut = (
            nn.Identity() if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride)
        )
        self.swap = swap

    def forward(self, x):
        if self.swap:
            return torch.relu(self.shortcut(x) + self.branch(x))
        return torch.relu(self.branch(x) + self.shortcut(x))


def resnet(seed: int, swap: bool) -> nn.Module:
    """The input itself as the first block's shortcut, then an identity and a strided block."""
    torch.manual_seed(seed)
    return nn.Sequential(
        Normalize([0.4, 0.5, 0.6], [0.2, 0.3, 0.25]),
        Block(3, 3, 1, swap), nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
        Block(4, 4, 1, not swap), Block(4, 6, 2, swap),
        nn.Flatten(), nn.Linear(6 * 5 * 5, 5),
    ).eval()  # fmt: skip


def case(swap: bool):
    graph = build_graph(resnet(int(swap), swap), (3, 10, 10), f"resnet{int(swap)}")
    x = torch.rand(2, 3, 10, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return graph, (x - 0.03).clamp(0, 1), (x + 0.03).clamp(0, 1)


def node_values(graph, point: torch.Tensor) -> list[torch.Tensor]:
    """Every node's value at ``point``, to check the boxes against."""
    values = [point]
    for op in graph.ops[1:]:
        values.append(op.forward(*(values[i] for i in op.inputs)))
    return values


def relu_inputs(graph) -> list[int]:
    return [op.inputs[0] for op in graph.ops if op.kind == "activation"]


@pytest.fixture(autouse=True)
def every_field(monkeypatch):
    """Crop whatever the field's size, beyond the 10x10 input too (most crops reach past its
    edge)."""
    monkeypatch.setattr(receptive, "SHARE", float("inf"))


@pytest.mark.parametrize("swap", [False, True])
def test_the_crops_pass_through_every_residual_addition(swap):
    graph, _, _ = case(swap)
    adds = [i for i, op in enumerate(graph.ops) if op.kind == "add"]
    assert len(adds) == 3 and {tuple(graph.ops[i].inputs) == tuple(sorted(graph.ops[i].inputs))
                               for i in adds} == {True, False}  # both orders  # fmt: skip
    for j in relu_inputs(graph)[:-1]:  # the last ReLU is after the dense layer
        crops = receptive.crops_for(graph, j)
        assert crops is not None, graph.ops[j].kind
        assert crops.graph.ops[crops.end].out_shape[-1] in (1, graph.ops[j].out_shape[0])
    sub = receptive.crops_for(graph, adds[-1])  # the strided block's shortcut reads less
    assert any(op.kind == "window" for op in sub.graph.ops)


@pytest.mark.parametrize("layout", ["flat", "spatial"])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_cropped_neurons_equal_the_dense_pass_row_by_row(swap, precision, layout, monkeypatch):
    """Same boxes in, every unstable neuron's two bounds out: the crop sums the same
    nonzero products as the dense pass, in another order (flat matrices or convolutions on
    windows, each forced here), so float64 (its margins left out) agrees to rounding;
    float32 to the margins' difference (each pass subtracts its own bound on its own
    rounding)."""
    ratio = float("inf") if layout == "flat" else 0.0
    monkeypatch.setattr(receptive, "SPATIAL_RATIO", ratio)
    if precision == "float64":  # the relaxations compared, without each pass's own margin
        monkeypatch.setattr(float64_margin, "applies", lambda a: False)
    graph, lower, upper = case(swap)
    assert {receptive.crops_for(graph, j).flat for j in relu_inputs(graph)[:-1]} == {
        layout == "flat"
    }
    with torch.no_grad(), receptive.dense_passes():
        boxes = b.linear_boxes(graph, lower, upper)
    tol = 1e-12 if precision == "float64" else 1e-5
    compared = 0
    for j in relu_inputs(graph)[:-1]:
        crops = receptive.crops_for(graph, j)
        with torch.no_grad(), rounding.pass_precision(precision):
            cropped = b._tighten_cropped(crops, j, boxes, "adaptive", 0)
            dense = b._tighten_dense(graph, j, boxes, "adaptive", True)
        for c, d in zip(cropped, dense, strict=True):
            assert ((c - d).abs() <= tol * (1 + d.abs())).all(), (j, (c - d).abs().max())
        lo, hi = boxes[j]
        compared += int(((lo < 0) & (hi > 0)).sum())
    assert compared > 100  # unstable neurons were bounded, not copied from the boxes


@pytest.mark.parametrize("layout", ["flat", "spatial"])
def test_the_float32_crops_margins_cover_their_rounding(layout, monkeypatch):
    """A float32 cropped pass subtracts its own rounding bound (the sub-window ops add
    none: copies), so each of its bounds is at or below the exact (float64) bound of the
    same relaxation on every row, at the image border and through both branches, whether
    the crop runs on flat matrices or on convolutions."""
    monkeypatch.setattr(receptive, "SPATIAL_RATIO", float("inf") if layout == "flat" else 0.0)
    graph, lower, upper = case(True)
    with torch.no_grad(), receptive.dense_passes():
        boxes = b.linear_boxes(graph, lower, upper)
    below = 0
    for j in relu_inputs(graph)[:-1]:
        crops = receptive.crops_for(graph, j)
        with torch.no_grad(), rounding.pass_precision("float32"):
            lo32, hi32 = b._tighten_cropped(crops, j, boxes, "adaptive", 0)
        with torch.no_grad(), rounding.pass_precision("float64"):
            lo64, hi64 = b._tighten_dense(graph, j, boxes, "adaptive", True)
        assert (lo32 <= lo64).all() and (hi32 >= hi64).all(), j
        below += int((lo32 < lo64).sum())
    assert below > 100  # the margins were subtracted, not skipped


@pytest.mark.parametrize("swap", [False, True])
def test_cropped_boxes_contain_sampled_values(swap):
    graph, lower, upper = case(swap)
    with torch.no_grad():
        boxes = b.linear_boxes(graph, lower, upper)
    ibp = b.interval_boxes(graph, lower, upper)
    j = relu_inputs(graph)[-2]  # the strided block's addition
    assert (boxes[j][0] > ibp[j][0] + 1e-6).any()  # tightened by the crops
    u = torch.rand(200, *lower.shape, generator=torch.Generator().manual_seed(6), dtype=lower.dtype)
    for point in lower + (upper - lower) * u:
        for value, (lo, hi) in zip(node_values(graph, point), boxes, strict=True):
            assert (value >= lo - 1e-12).all() and (value <= hi + 1e-12).all()


def test_a_node_read_by_a_relu_and_a_padded_convolution_is_not_cropped():
    """Past the edge a padded convolution reads 0, a ReLU's crop input -TINY: one fill
    cannot serve both, so such a node's readers stay dense."""
    torch.manual_seed(0)

    class PreActivation(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.inner = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return torch.relu(self.inner(y) + torch.relu(y))

    graph = build_graph(nn.Sequential(PreActivation(), nn.Flatten(), nn.Linear(300, 2)).eval(),
                        (3, 10, 10), "pre")  # fmt: skip
    add = next(i for i, op in enumerate(graph.ops) if op.kind == "add")
    assert receptive.crops_for(graph, add) is None


def test_a_window_passes_coefficients_back_to_the_positions_it_copies():
    index = torch.tensor([5, 0, 7, 2])
    window = ops.Window("w", [0], (4,), index=index)
    x = torch.randn(3, 9, dtype=torch.float64)
    a = torch.randn(3, 2, 4, dtype=torch.float64)
    (back,), shift = window.backward(a, (x, x))
    assert torch.equal(window.forward(x), x[:, index]) and not shift.any()
    assert torch.equal(back[:, :, index], a) and not back[:, :, [1, 3, 4, 6, 8]].any()


def test_alpha_crowns_plan_counts_a_crop_through_an_addition_as_the_graph_up_to_it():
    """The search plan's work estimate keeps the choice it had before these crops: their
    element count undercounts their searches (``search_plan.pass_elements``)."""
    graph, _, _ = case(False)
    j = relu_inputs(graph)[1]  # the first block's addition
    assert graph.ops[j].kind == "add" and receptive.crops_for(graph, j) is not None
    whole = sum(math.prod(op.out_shape) for op in graph.ops[: j + 1])
    assert search_plan.pass_elements(graph, j) == whole
    chain = relu_inputs(graph)[0]  # a convolution straight after the input: its crop
    assert search_plan.pass_elements(graph, chain) < whole
