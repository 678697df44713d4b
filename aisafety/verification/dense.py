"""A sequential graph as dense affine maps between its activations: z_l = M_l a_(l-1) + c_l,
the last map ending at the output. The matrix-level verifiers (RecurJac, the SDPs) are
written in these terms; the maps come from the ops' own backward and forward passes, so
convolutions, reshapes and normalisation need no code of their own."""

from __future__ import annotations

import torch

from aisafety.verification.graph import BoundGraph


def affine_segments(graph: BoundGraph) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
    """[(M_l (n_out, n_in), c_l (n_out,))] per segment, and the activation ops' indices."""
    cuts = [i for i, op in enumerate(graph.ops) if op.kind == "activation"]
    ends = [graph.ops[i].inputs[0] for i in cuts] + [len(graph.ops) - 1]
    starts = [0] + cuts
    maps = []
    for start, end in zip(starts, ends, strict=True):
        shape = graph.ops[end].out_shape
        n = int(torch.Size(shape).numel())
        back = torch.eye(n, dtype=graph.dtype).reshape(1, n, *shape)
        value = torch.zeros(1, *graph.ops[start].out_shape, dtype=graph.dtype)
        for op in reversed(graph.ops[start + 1 : end + 1]):
            (back,), _ = op.backward(back, None)
        for op in graph.ops[start + 1 : end + 1]:
            value = op.forward(value)
        maps.append((back.reshape(n, -1), value.flatten()))
    return maps, cuts
