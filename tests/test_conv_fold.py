"""A first convolution's backward rule as a product and ``F.fold`` (``ops.Conv._folded``):
the transposed convolution's adjoint, and CROWN's float32 passes through it stay below the
float64 bound of the same relaxation and below sampled values on a net built to round badly
(the rounding margin's ``C_out * taps`` terms per sum hold for the fold's grouping)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aisafety.verification import ops, rounding
from aisafety.verification.graph import build_graph
from tests.test_rounding import (
    assert_float32_crown_below_samples,
    case,
    naive_float32,
    spec_bounds,
)

# (in, out, kernel, stride, padding, dilation, size): one with rows the conv does not reach
SHAPES = [(1, 16, 4, 2, 1, 1, 28), (3, 32, 3, 1, 1, 1, 12), (1, 16, 3, 2, 0, 1, 11),
          (2, 8, 2, 2, 0, 2, 9), (3, 27, 3, 2, 1, 1, 10)]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_the_folded_rule_is_the_convolutions_adjoint(shape):
    c_in, c_out, k, stride, padding, dilation, size = shape
    conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=padding, dilation=dilation)
    op = build_graph(nn.Sequential(conv).double(), (c_in, size, size)).ops[1]
    assert op._folds()
    a = torch.randn(2, 5, *op.out_shape, dtype=torch.float64)
    (back,), _ = op.backward(a, None, constant=False)
    x = torch.randn(2, c_in, size, size, dtype=torch.float64)
    # <a, W x> = <back, x> for every row
    linear = F.conv2d(x, op.weight, None, op.stride, op.padding, op.dilation).unsqueeze(1)
    left, right = (a * linear).flatten(2).sum(2), (back * x.unsqueeze(1)).flatten(2).sum(2)
    assert torch.allclose(left, right, rtol=1e-12, atol=1e-10)


def test_wider_layers_keep_the_transposed_convolution():
    for conv in (nn.Conv2d(4, 64, 3), nn.Conv2d(3, 16, 3), nn.Conv2d(2, 8, 2, groups=2)):
        graph = build_graph(nn.Sequential(conv), (conv.in_channels, 8, 8))
        assert not graph.ops[1]._folds()


def first_conv_net(seed: int) -> nn.Module:
    """Conv-Small's shape on 12x12 inputs, weights x300 and offsets 1e4: sums cancel."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 16, 4, stride=2, padding=1), nn.ReLU(),
                        nn.Conv2d(16, 8, 4, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(72, 5))  # fmt: skip
    with torch.no_grad():
        for layer in net:
            if isinstance(layer, nn.Conv2d | nn.Linear):
                layer.weight.mul_(300)
                layer.bias.add_(1e4)
    return net.eval()


def _case(seed: int):
    return case(first_conv_net(seed), 0.5, shape=(1, 12, 12))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_passes_through_a_folded_convolution_stay_below_float64(seed):
    graph, prop = _case(seed)
    assert graph.ops[1]._folds() and rounding.fast_graph(graph, 1 << 20) is not None
    exact = spec_bounds(graph, prop, "float64")
    rounded = spec_bounds(graph, prop, "float32")
    assert (rounded <= exact).all(), float((rounded - exact).max())
    assert (naive_float32(graph, prop) > exact).any()  # the case rounds badly
    assert (exact - rounded).max() <= 1e-3 * (1 + exact.abs().max())


def test_float32_crown_through_a_folded_convolution_is_below_sampled_values():
    assert_float32_crown_below_samples(*_case(3))


def test_the_fold_and_the_transposed_convolution_give_bounds_within_rounding(monkeypatch):
    graph, prop = _case(0)
    new = spec_bounds(graph, prop, "float32")
    monkeypatch.setattr(ops, "FOLD_CHANNELS", 0)
    old = spec_bounds(graph, prop, "float32")
    assert torch.allclose(new, old, rtol=1e-5, atol=1e-3)
