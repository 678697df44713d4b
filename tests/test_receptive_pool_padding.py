"""Receptive-field crops around a max-pool and a padded convolution (``receptive.py``).

A crop fills the positions past a node's edge with 0 (or, below a ReLU, -TINY: a stably
inactive ReLU). A padded convolution reading a max-pool directly would read positions the
crop's max-pool computes from that fill, where the network has 0: such a chain is kept
dense (``_croppable``: a padded convolution must read a ReLU). With a ReLU between them, the
ReLU's box past the edge is pinned at [-TINY, -TINY], so its relaxation zeroes whatever the
crop's max-pool computes there. Checked here: where the crops stop, and that the cropped
boxes of every node contain the sampled values and stay within float rounding of the dense
passes' boxes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from aisafety.verification import receptive, rounding
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import CrownVerifier
from aisafety.verification.property import robustness_property


def _net(relu_between: bool) -> nn.Sequential:
    torch.manual_seed(0)
    between = [nn.ReLU()] if relu_between else []
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), *between,
                        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(),
                        nn.Flatten(), nn.LazyLinear(10))  # fmt: skip
    net(torch.zeros(1, 1, 28, 28))
    return net.eval()


def _boxes(net: nn.Sequential, prop, dense: bool):
    graph = build_graph(net, (1, 28, 28), "pool-pad", dtype=torch.float64)
    with torch.no_grad():
        if dense:
            with receptive.dense_passes():
                return graph, CrownVerifier().boxes(graph, prop)
        return graph, CrownVerifier().boxes(graph, prop)


def test_a_padded_convolution_reading_a_max_pool_is_kept_dense():
    graph = build_graph(_net(relu_between=False), (1, 28, 28), "pool-pad", dtype=torch.float64)
    cropped = [j for j in range(len(graph.ops)) if receptive.crops_for(graph, j) is not None]
    assert [graph.ops[j].kind for j in cropped] == ["conv", "activation", "maxpool"]


@pytest.mark.parametrize("relu_between", [False, True])
def test_cropped_boxes_hold_the_samples_and_match_the_dense_passes(relu_between):
    net = _net(relu_between)
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    prop = robustness_property(x, torch.zeros(2, dtype=torch.long), 0.03, 10)
    graph, cropped = _boxes(net, prop, dense=False)
    _, dense = _boxes(net, prop, dense=True)
    if relu_between:  # the crops reach past the padded convolution
        assert receptive.crops_for(graph, len(graph.ops) - 3) is not None
    u = torch.rand(500, 2, 1, 28, 28, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    values = (prop.lower + (prop.upper - prop.lower) * u).flatten(0, 1)
    exact = copy.deepcopy(net).double()
    for j, ((lo, hi), (dlo, dhi)) in enumerate(zip(cropped, dense, strict=True)):
        if j:
            values = exact[j - 1](values)
        sampled = values.view(500, 2, *values.shape[1:])
        assert (sampled >= lo).all() and (sampled <= hi).all(), graph.ops[j].kind
        scale = 1 + torch.maximum(dlo.abs(), dhi.abs())
        assert ((lo - dlo).abs() <= 1e-6 * scale).all() and ((hi - dhi).abs() <= 1e-6 * scale).all()


@pytest.mark.parametrize("relu_between", [False, True])
def test_with_float64_passes_the_cropped_boxes_equal_the_dense_ones(relu_between):
    """The default passes run in float32 with a rounding margin that grows with the number
    of terms summed, and a crop sums fewer: its boxes are tighter by up to about 1e-7. With
    every pass in float64 (no margin) the two agree to float64 rounding, so that difference
    is the margins', not the crops' fill past the max-pool's edge."""
    net = _net(relu_between)
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    prop = robustness_property(x, torch.zeros(2, dtype=torch.long), 0.03, 10)
    with rounding.pass_precision("float64"):
        _, cropped = _boxes(net, prop, dense=False)
        _, dense = _boxes(net, prop, dense=True)
    for (lo, hi), (dlo, dhi) in zip(cropped, dense, strict=True):
        assert torch.allclose(lo, dlo, rtol=0, atol=1e-12)
        assert torch.allclose(hi, dhi, rtol=0, atol=1e-12)
