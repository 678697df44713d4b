"""Which intermediate bounds alpha-CROWN's slope search tightens, per sample, under a work limit.

A search on node ``j``'s bounds runs ``steps`` backward passes with gradients for two rows
per unstable neuron, each over ``j``'s pass graph (its receptive-field crop where
``receptive.py`` crops it, else the graph up to ``j``). Its work is estimated as
``2 x unstable neurons x elements of that graph`` (measured on resnet_4b at 1/255: 0.2 to
1.3 CPU s per 10^6 of it for 20 steps, one thread). On MNIST nets all of a sample's searches
fit in a few 10^6; on the CIFAR ResNets and the Keras CNN they take 10^8 to 10^10 (minutes
to hours per image). The deepest bounds gain the most from a search (the relaxation error
grows with depth: resnet_4b, image 0, mean width -0.2% on the first layers, -17% on the
last), so each sample's searches go from the deepest node back while their summed work stays
within the limit; the other nodes keep CROWN's bounds. The choice depends on the sample
alone, not on the batch it comes in.
"""

from __future__ import annotations

import torch

from aisafety.verification import receptive
from aisafety.verification.bounds import depends_on_activation
from aisafety.verification.budget import numel
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.relaxations import RELU


def searched_samples(
    graph: BoundGraph, boxes: list[Box], work: float | None
) -> dict[int, torch.Tensor] | None:
    """Per ReLU input node ``j`` after the first activation, the samples (bool, (B,)) whose
    bounds of ``j`` the search tightens, given CROWN's ``boxes``; None when it tightens every
    bound of every sample (``work`` None, or every sample's searches fit)."""
    if work is None:
        return None
    nodes = _searchable(graph)
    batch = boxes[0][0].shape[0]
    spent = torch.zeros(batch, dtype=torch.float64)
    chosen, stopped = {}, torch.zeros(batch, dtype=torch.bool)
    for j in reversed(nodes):  # the deepest first
        lo, hi = boxes[j]
        unstable = ((lo < 0) & (hi > 0)).reshape(batch, -1).sum(1).to(torch.float64)
        spent = spent + 2 * unstable * pass_elements(graph, j)
        stopped = stopped | (spent > work)  # a suffix of the nodes per sample
        chosen[j] = ~stopped
    if all(bool(mask.all()) for mask in chosen.values()):
        return None
    return chosen


def _searchable(graph: BoundGraph) -> list[int]:
    """The ReLU input nodes that ``bounds.linear_boxes`` tightens (after an activation)."""
    deep, nodes = depends_on_activation(graph), []
    for op in graph.ops:
        if op.kind == "activation" and op.relaxation is RELU and deep[op.inputs[0]]:
            nodes.append(op.inputs[0])
    return nodes


def pass_elements(graph: BoundGraph, j: int) -> int:
    """Elements of the graph one row's backward pass from node ``j`` runs over. A crop
    through a residual addition counts as the graph up to ``j``, as before such crops
    existed: its elements undercount its searches (on small-resnet they took 140 CPU s
    against 16 for the whole alpha-CROWN run without them, for a bound 4e-4 higher;
    docs/certification.md), so the choice of searched nodes stays the one measured."""
    crops = receptive.crops_for(graph, j)
    through_add = crops is not None and any(op.kind == "add" for op in crops.graph.ops)
    chain, end = (graph, j) if crops is None or through_add else (crops.graph, crops.end)
    return sum(numel(op.out_shape) for op in chain.ops[: end + 1])
