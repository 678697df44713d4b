"""Interval bound propagation through each op's own ``interval`` rule, then the spec rows
bounded from the output box: sound, and looser than the built-in ``ibp``, which folds the
spec into the last layer (elision). It shows a verifier needs only ``aisafety.plugin``.
"""

from __future__ import annotations

import torch

from aisafety.plugin import BoundGraph, Property, Verifier

KINDS = {
    "input",
    "dense",
    "conv",
    "elementwise",
    "reshape",
    "positive-linear",
    "add",
    "activation",
    "maxpool",
}


class PlainIBP(Verifier):
    name = "plain-ibp-demo"
    description = "interval bound propagation without elision (a plugin from aisafety.plugin)"
    kinds = KINDS

    def lower_bounds(
        self, graph: BoundGraph, prop: Property
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        boxes = [(prop.lower, prop.upper)]
        for op in graph.ops[1:]:
            boxes.append(op.interval(*(boxes[i] for i in op.inputs)))
        low, high = boxes[-1]  # (B, classes)
        spec = prop.spec  # (B, K, classes): C z >= C+ low + C- high
        bound = spec.clamp(min=0) @ low.unsqueeze(2) + spec.clamp(max=0) @ high.unsqueeze(2)
        return bound.squeeze(2), None
