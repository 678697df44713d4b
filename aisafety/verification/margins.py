"""Margin bounds of a PyTorch network for training and quick checks (IBP, CROWN-IBP).

``f_y - f_j`` for every class j (the row j = y is zero) over the l-inf ball of radius eps
around x within [0, 1]; ``certified`` where every other margin is > 0. The network's graph
is traced once and kept while the network lives: its ops hold the network's parameters
themselves, so the bounds follow training steps and are differentiable (float32).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from aisafety.verification import bounds as b
from aisafety.verification.graph import BoundGraph, build_graph

_GRAPHS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, ...], BoundGraph]] = (
    weakref.WeakKeyDictionary()
)


def network_graph(network: nn.Module, input_shape: tuple[int, ...]) -> BoundGraph:
    """The float32 bound graph of ``network``, traced once per network and input shape."""
    cached = _GRAPHS.get(network)
    if cached is None or cached[0] != input_shape:
        name = type(network).__name__
        cached = input_shape, build_graph(network, input_shape, name, torch.float32, trainable=True)
        _GRAPHS[network] = cached
    return cached[1]


def margin_matrix(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """C with C[b, j] = e_y - e_j, so C f = (f_y - f_j)_j (row y is zero)."""
    eye = torch.eye(num_classes, device=y.device)
    return eye[y].unsqueeze(1) - eye.unsqueeze(0)


def _setup(network: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float):
    graph = network_graph(network, tuple(x.shape[1:]))
    lower, upper = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
    boxes = b.interval_boxes(graph, lower, upper)
    return graph, boxes, margin_matrix(y, graph.ops[-1].out_shape[-1])


def ibp_margin_bounds(network: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float):
    """Lower bounds (B, classes) of f_y - f_j by IBP with the margin folded into the last layer."""
    graph, boxes, spec = _setup(network, x, y, eps)
    graph.require(b.IBP_KINDS, "IBP")
    return b.ibp_spec_lower(graph, boxes, spec)


def crown_ibp_margin_bounds(network: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float):
    """Lower bounds of f_y - f_j by CROWN's backward pass on IBP intermediate bounds."""
    graph, boxes, spec = _setup(network, x, y, eps)
    graph.require(b.LINEAR_KINDS, "CROWN-IBP")
    return b.spec_lower(graph, boxes, spec)[0]


def certified(lower_margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """True where every margin to another class has a positive lower bound."""
    others = lower_margins.scatter(1, y.unsqueeze(1), float("inf"))
    return (others > 0).all(1)


def robust_cross_entropy(lower_margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CE of the worst-case logits -m (Gowal et al. eq. 7): y scores 0, class j scores -m_j."""
    return F.cross_entropy(-lower_margins, y)
