"""Intermediate bounds on receptive-field crops (``verification/receptive.py``) equal the
dense passes' and contain every sampled value, on a random conv chain with normalisation,
padding, strides, dilation and BatchNorm."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.prediction.torch_module import Normalize
from aisafety.verification import bounds as b
from aisafety.verification import receptive, rounding
from aisafety.verification.graph import build_graph


def chain(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    bn = nn.BatchNorm2d(6)
    bn.running_mean.uniform_(-0.2, 0.2)
    bn.running_var.uniform_(0.5, 2.0)
    return nn.Sequential(
        Normalize([0.4, 0.5], [0.2, 0.3]),
        nn.Conv2d(2, 6, 3, stride=2, padding=1), bn, nn.ReLU(),
        nn.Conv2d(6, 8, 3, padding=2, dilation=2), nn.ReLU(),
        nn.Conv2d(8, 8, 4, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 5),
    ).eval()  # fmt: skip


def cases():
    for seed in (0, 1):
        net = chain(seed)
        x = torch.rand(3, 2, 24, 24, generator=torch.Generator().manual_seed(seed))
        graph = build_graph(net, (2, 24, 24), f"chain{seed}")
        yield graph, net, (x - 0.05).clamp(0, 1).double(), (x + 0.05).clamp(0, 1).double()


def boxes_of(graph, lower, upper, steps: int = 0):
    with torch.no_grad():
        cropped = b.linear_boxes(graph, lower, upper, alpha_steps=steps)
        with receptive.dense_passes():
            dense = b.linear_boxes(graph, lower, upper, alpha_steps=steps)
    return cropped, dense


def test_the_chain_is_cropped_where_receptive_fields_are_small():
    graph = next(cases())[0]
    cropped = [j for j in range(len(graph.ops)) if receptive.crops_for(graph, j) is not None]
    assert cropped  # the first layers' neurons see a small part of the 24x24 input
    assert receptive.crops_for(graph, len(graph.ops) - 1) is None  # a dense layer
    with receptive.dense_passes():
        assert all(receptive.crops_for(graph, j) is None for j in range(len(graph.ops)))


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_cropped_bounds_equal_the_dense_passes_and_contain_sampled_values(precision):
    tol = 1e-10 if precision == "float64" else 1e-5  # float32: margins summed differently
    for graph, _, lower, upper in cases():
        with rounding.pass_precision(precision):
            cropped, dense = boxes_of(graph, lower, upper)
        ibp = b.interval_boxes(graph, lower, upper)
        tightened = 0
        for (lo, hi), (dlo, dhi), (ilo, _) in zip(cropped, dense, ibp, strict=True):
            assert torch.allclose(lo, dlo, rtol=0, atol=tol)
            assert torch.allclose(hi, dhi, rtol=0, atol=tol)
            tightened += int((lo > ilo + 1e-6).sum())
        assert tightened > 0  # the crops did tighten IBP's boxes
        generator = torch.Generator().manual_seed(3)
        points = lower + (upper - lower) * torch.rand(64, *lower.shape, generator=generator,
                                                      dtype=lower.dtype)  # fmt: skip
        for point in points:
            values = [point]
            for op in graph.ops[1:]:
                values.append(op.forward(*(values[i] for i in op.inputs)))
            for value, (lo, hi) in zip(values, cropped, strict=True):
                assert (value >= lo - 1e-9).all() and (value <= hi + 1e-9).all()


def test_cropped_alpha_crown_intermediate_bounds_match_the_dense_ones_on_average():
    """Adam's first step moves a slope by lr * sign(gradient), so a slope whose gradient is
    at rounding level (summed in another order on a crop) can go either way: single
    neurons differ by up to about 1e-2, the mean by far less, neither side looser."""
    graph, _, lower, upper = next(cases())
    cropped, dense = boxes_of(graph, lower, upper, steps=2)
    for (lo, hi), (dlo, dhi) in zip(cropped, dense, strict=True):
        for mine, theirs in ((lo, dlo), (dhi, hi)):
            assert float((mine - theirs).abs().max()) < 2e-2
            assert abs(float((mine - theirs).mean())) < 2e-4
