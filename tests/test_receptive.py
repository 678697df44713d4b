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


class Pooled(nn.Module):
    """The Keras CIFAR-10 CNN's shape, smaller: its NHWC input's two permutations (NCHW ->
    NHWC as the predictor feeds it, NHWC -> NCHW inside the ONNX graph), unpadded
    convolutions with ReLU then BatchNorm, 2x2 max-pools (the crops chain through them)."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        norms = [nn.BatchNorm2d(c) for c in (4, 4, 6)]
        for bn in norms:
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
        self.normalize = Normalize([0.4, 0.5], [0.2, 0.3])
        self.body = nn.Sequential(
            nn.Conv2d(2, 4, 3), nn.ReLU(), norms[0], nn.Conv2d(4, 4, 3), nn.ReLU(), norms[1],
            nn.MaxPool2d(2), nn.Conv2d(4, 6, 3), nn.ReLU(), norms[2], nn.Conv2d(6, 6, 3),
            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 3 * 3, 5),
        )  # fmt: skip
        self.eval()

    def forward(self, x):
        nhwc = torch.permute(self.normalize(x), (0, 2, 3, 1))
        return self.body(torch.permute(nhwc, (0, 3, 1, 2)))


class PooledByMethod(Pooled):
    """``Pooled`` with its permutations written as tensor methods (``x.permute``)."""

    def forward(self, x):
        nhwc = self.normalize(x).permute(0, 2, 3, 1)
        return self.body(nhwc.permute(0, 3, 1, 2))


def test_a_permutation_written_as_a_method_bounds_like_the_function():
    x = torch.rand(3, 2, 26, 26, generator=torch.Generator().manual_seed(2))
    lower, upper = (x - 0.02).clamp(0, 1).double(), (x + 0.02).clamp(0, 1).double()
    boxes = []
    for net in (Pooled(2), PooledByMethod(2)):
        graph = build_graph(net, (2, 26, 26), type(net).__name__)
        assert [op.kind for op in graph.ops][2:4] == ["positive-linear", "positive-linear"]
        with torch.no_grad():
            boxes.append(b.linear_boxes(graph, lower, upper))
    for (lo, hi), (mlo, mhi) in zip(*boxes, strict=True):
        assert torch.equal(lo, mlo) and torch.equal(hi, mhi)


def cases():
    for seed in (0, 1):
        net = chain(seed)
        x = torch.rand(3, 2, 24, 24, generator=torch.Generator().manual_seed(seed))
        graph = build_graph(net, (2, 24, 24), f"chain{seed}")
        yield graph, net, (x - 0.05).clamp(0, 1).double(), (x + 0.05).clamp(0, 1).double()
    net = Pooled(2)
    x = torch.rand(3, 2, 26, 26, generator=torch.Generator().manual_seed(2))
    graph = build_graph(net, (2, 26, 26), "pooled")
    yield graph, net, (x - 0.02).clamp(0, 1).double(), (x + 0.02).clamp(0, 1).double()


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


def test_the_crops_chain_through_permutations_and_max_pooling():
    """On the pooled net the leading permutations go with the normalisation onto the box,
    and the convolution after the first max-pool is cropped, on (C, h, w) windows."""
    graph = list(cases())[-1][0]
    kinds = [op.kind for op in graph.ops]
    pool = kinds.index("maxpool")
    after = [j for j in range(pool, len(kinds)) if receptive.crops_for(graph, j) is not None]
    assert kinds[2:4] == ["positive-linear", "positive-linear"]
    assert receptive.crops_for(graph, 7).flat  # two 3x3 convolutions on a small crop
    assert after and not receptive.crops_for(graph, after[0]).flat
    assert receptive.crops_for(graph, after[0]).first == 3  # after the two permutations


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


def test_spatial_crops_of_a_chain_without_pooling_equal_the_dense_passes(monkeypatch):
    """Where a convolution's dense crop matrix would exceed ``LARGEST`` the crop keeps the
    convolutions themselves, on (C, h, w) windows: same bounds as the dense passes."""
    monkeypatch.setattr(receptive, "LARGEST", 1)  # every crop spatial
    graph, _, lower, upper = next(cases())
    assert any(not c.flat for j in range(len(graph.ops)) if (c := receptive.crops_for(graph, j)))
    with rounding.pass_precision("float64"):
        cropped, dense = boxes_of(graph, lower, upper)
    for (lo, hi), (dlo, dhi) in zip(cropped, dense, strict=True):
        assert torch.allclose(lo, dlo, rtol=0, atol=1e-10)
        assert torch.allclose(hi, dhi, rtol=0, atol=1e-10)


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


class Block(nn.Module):
    """A ResNet block: ``relu(conv(relu(conv(x))) + shortcut(x))``, 3x3 convolutions, a 1x1
    convolution as the shortcut where the stride or the width changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.branch = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1), nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1)
        )
        self.shortcut = nn.Conv2d(cin, cout, 1, stride) if stride > 1 else nn.Identity()

    def forward(self, x):
        return torch.relu(self.branch(x) + self.shortcut(x))


def test_a_field_over_half_the_input_is_cropped_and_keeps_its_convolutions():
    """resnet_4b's shape (32x32 input, a stride-2 stem and a stride-2 block, 3x3
    convolutions): the second block's first convolution sees 23x23 input pixels, over half
    the input. Its crop's dense matrices would take 18.8x its convolutions' products (a flat
    crop ran no faster than the dense pass), so it keeps them on (C, h, w) windows (2.5x
    faster than the dense pass, docs/certification.md); the stem's 7x7 crop stays flat."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), Block(16, 32, 2), Block(32, 32, 1),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
    ).eval()  # fmt: skip
    graph = build_graph(net, (3, 32, 32), "resnet_4b-shaped")
    relu_inputs = [op.inputs[0] for op in graph.ops if op.kind == "activation"]
    stem, _, second, last = relu_inputs[1:5]  # the first block's convolution and addition
    assert receptive.crops_for(graph, stem).flat
    crops = receptive.crops_for(graph, second)
    assert graph.ops[second].kind == "conv" and crops is not None and not crops.flat
    assert crops.windows[0].shape == (3, 23, 23)
    assert receptive.crops_for(graph, last) is None  # 31x31 pixels: dense
