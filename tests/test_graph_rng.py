"""Building a bound graph leaves torch's global random state alone: its tracing example is
drawn from a generator of its own. It was drawn from the global one, so building a graph
(``verify``, a certified metric) moved every later unseeded draw of the user's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from aisafety.verification.graph import build_graph


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Linear(64, 3),
    ).eval()


def same(a: Any, b: Any) -> bool:
    """Equal bit for bit: tensors by value and dtype, containers and ops field by field."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return type(a) is type(b) and same(vars(a), vars(b))
    return a == b


def test_building_a_graph_leaves_the_global_random_state_as_it_was():
    net = conv_net()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    build_graph(net, (1, 4, 4), "conv")
    assert torch.equal(torch.get_rng_state(), state)


def test_the_graph_does_not_depend_on_the_global_random_state():
    """The same ops and weights whatever the global seed, and the network's outputs."""
    net = conv_net()
    torch.manual_seed(1)
    first = build_graph(net, (1, 4, 4), "conv")
    torch.manual_seed(2)
    second = build_graph(net, (1, 4, 4), "conv")
    assert same(first.ops, second.ops)
    x = torch.rand(5, 1, 4, 4, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(first.forward(x.double()), net(x).double(), atol=1e-6)
