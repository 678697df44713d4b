"""A bound graph built from a module holds plain tensors, not the module's parameters
(``graph.build_graph``), so CROWN's boxes carry no autograd graph; training's graphs
(``margins.py``, ``trainable``) keep the parameters and stay differentiable."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.verification import bounds
from aisafety.verification.graph import build_graph
from aisafety.verification.margins import ibp_margin_bounds
from tests.test_split_rounding import Residual


def conv_net() -> nn.Module:
    """Conv, BatchNorm, a residual block, max-pooling, dense layers: every kind of weight."""
    torch.manual_seed(4)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), Residual(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3 * 4 * 4, 10), nn.Sigmoid(), nn.Linear(10, 3),
    ).eval()  # fmt: skip


def stored(graph) -> list[torch.Tensor]:
    return [v for op in graph.ops for v in vars(op).values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_crowns_boxes_on_a_module_built_graph_carry_no_autograd_graph(dtype):
    net = conv_net()  # float32 (a float64 graph holds float64 copies, detached before too)
    graph = build_graph(net, (1, 8, 8), "conv", dtype=dtype)
    assert not any(t.requires_grad for t in stored(graph))
    x = torch.rand(2, 1, 8, 8, dtype=dtype)
    boxes = bounds.linear_boxes(graph, x - 0.02, x + 0.02)
    spec = torch.eye(3, dtype=dtype).expand(2, 3, 3) - torch.eye(3, dtype=dtype)[0]
    bound, coeff = bounds.spec_lower(graph, boxes, spec[:, 1:])
    for t in [bound, coeff, *(t for box in boxes for t in box)]:
        assert not t.requires_grad and t.grad_fn is None
    # the module is untouched: its parameters still require grad, and give the same logits
    assert all(p.requires_grad and isinstance(p, nn.Parameter) for p in net.parameters())
    with torch.no_grad():
        assert torch.allclose(graph.forward(x).float(), net(x.float()), atol=1e-5)


def test_training_graphs_keep_the_parameters_and_their_gradients():
    net = conv_net()
    graph = build_graph(net, (1, 8, 8), "conv", torch.float32, trainable=True)
    assert any(t is net[0].weight for t in stored(graph))
    x, y = torch.rand(2, 1, 8, 8), torch.tensor([0, 2])
    boxes = bounds.linear_boxes(graph, x - 0.02, x + 0.02)
    assert boxes[-1][0].grad_fn is not None  # what every graph's boxes carried before
    ibp_margin_bounds(net, x, y, 0.02).sum().backward()
    assert net[0].weight.grad is not None and net[-1].weight.grad is not None
