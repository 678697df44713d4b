"""torch.export writes ``nn.ReLU(inplace=True)`` and ``out += identity`` (every torchvision
ResNet) as ``aten.relu_`` and ``aten.add_``: the bound graph refused them, so the .pt2 of a
torchvision-style ResNet could not be verified. They are read as ``relu`` and ``add`` where
nothing reads the written memory afterwards, and refused where something does."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import fx, nn

from aisafety.prediction.exported import ExportedPredictor
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.verification import bounds
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.inplace import out_of_place

aten = torch.ops.aten
SHAPE = (3, 8, 8)


class _Bottleneck(nn.Module):
    """torchvision's residual pattern: in-place ReLUs and ``out += identity``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 3, 3, padding=1), nn.BatchNorm2d(3)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(3 * 8 * 8, 5)
        for bn in (self.bn1, self.bn2):  # running statistics away from 0 and 1
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        out = self.relu(out)
        return self.fc(torch.flatten(out, 1))


def _exported(net: nn.Module) -> ExportedPredictor:
    batch = torch.export.Dim("batch")
    program = torch.export.export(net, (torch.rand(2, *SHAPE),), dynamic_shapes=({0: batch},))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return ExportedPredictor(program, SHAPE, 5, name="pt2")


def test_in_place_relu_and_add_are_bounded_as_the_modules_graph():
    net = _Bottleneck().eval()
    exported = _exported(net)
    targets = {n.target for n in exported.bound_network[1].graph.graph.nodes}
    assert {aten.relu_.default, aten.add_.Tensor} <= targets  # what torch.export wrote
    graph = build_graph(exported.bound_network, SHAPE, "pt2")
    peer = build_graph(TorchPredictor(net, SHAPE, 5).network, SHAPE, "module")
    x = torch.rand(1, *SHAPE, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lower, upper = (x - 0.02).clamp(0, 1), (x + 0.02).clamp(0, 1)
    low, high = bounds.linear_boxes(graph, lower, upper)[-1]
    peer_low, peer_high = bounds.linear_boxes(peer, lower, upper)[-1]
    torch.testing.assert_close(low, peer_low, rtol=0, atol=1e-9)
    torch.testing.assert_close(high, peer_high, rtol=0, atol=1e-9)
    points = lower + torch.rand(64, *SHAPE, dtype=torch.float64) * (upper - lower)
    with torch.no_grad():
        values = net.double()(points)
    assert (values >= low - 1e-9).all() and (values <= high + 1e-9).all()
    assert float((high - low).max()) > 0  # a real box, not a point


def _graph(read_after: bool, view_before: bool = False) -> tuple[fx.Graph, fx.Node]:
    """x -> a = 2x -> relu_(a); then a read again after the write, or a view of a taken
    before it and read after: both see relu(a) in torch, 2x in a functional graph."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(aten.mul.Tensor, (x, 2.0))
    view = graph.call_function(aten.view.default, (a, [-1, 2, 2])) if view_before else None
    written = graph.call_function(aten.relu_.default, (a,))
    later = view if view_before else (a if read_after else written)
    out = graph.call_function(aten.add.Tensor, (later, 1.0))
    graph.output(out)
    return graph, written


@pytest.mark.parametrize("read_after, view_before", [(True, False), (False, True)])
def test_an_in_place_write_read_afterwards_is_refused(read_after, view_before):
    graph, written = _graph(read_after, view_before)
    order = {node: i for i, node in enumerate(graph.nodes)}
    assert out_of_place(written, order) is None
    with pytest.raises(VerificationError, match="relu_.default writing a value read after it"):
        build_graph(fx.GraphModule(nn.Module(), graph), (4,), "hand-made")


def test_an_in_place_write_read_by_nothing_after_is_its_twin():
    graph, written = _graph(read_after=False)
    order = {node: i for i, node in enumerate(graph.nodes)}
    assert out_of_place(written, order) is aten.relu.default
