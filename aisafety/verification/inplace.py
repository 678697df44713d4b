"""torch.export's in-place ATen ops (``relu_``, ``add_``) read as their out-of-place twins.

A module with ``nn.ReLU(inplace=True)`` or ``out += identity`` (every torchvision ResNet)
exports to ``aten.relu_`` and ``aten.add_``, which write into their first argument; the
bound graph refused them, so such a ``.pt2`` could not be verified. The bound graph is
functional: reading ``relu_(x)`` as ``relu(x)`` computes the same network only when nothing
reads ``x``, or a tensor sharing its memory, after the write. ``out_of_place`` checks that
on the graph's order and answers None otherwise (the caller refuses the op, naming it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

aten = torch.ops.aten
OUT_OF_PLACE = {
    aten.relu_.default: aten.relu.default,
    aten.sigmoid_.default: aten.sigmoid.default,
    aten.tanh_.default: aten.tanh.default,
    aten.add_.Tensor: aten.add.Tensor,
    aten.sub_.Tensor: aten.sub.Tensor,
    aten.mul_.Tensor: aten.mul.Tensor,
    aten.div_.Tensor: aten.div.Tensor,
}


def out_of_place(node: fx.Node, order: dict[fx.Node, int]) -> Any | None:
    """The out-of-place twin of ``node``'s in-place op, or None when a node after it reads
    the memory it writes (then the twin would compute another network)."""
    written = node.args[0]
    if not isinstance(written, fx.Node):
        return None
    sharers = _sharing_memory(written)
    for shared in sharers:
        for user in shared.users:
            if user is node or user in sharers:
                continue
            if order[user] > order[node] or _returns_alias(user):  # read after, or a view
                return None
    return OUT_OF_PLACE[node.target]


def _sharing_memory(node: fx.Node) -> list[fx.Node]:
    """``node`` and the nodes upstream whose tensor it is (through in-place ops and views)."""
    chain = [node]
    while _returns_alias(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
        chain.append(node)
    return chain


def _returns_alias(node: fx.Node) -> bool:
    """An ATen op whose result shares its first argument's memory (a view, an in-place op);
    ops of other kinds (modules, Python functions) are taken as returning new tensors."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return False
    return schema.returns[0].alias_info is not None
