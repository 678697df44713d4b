"""DeepZ (Singh et al. 2018): zonotopes x = c + G e, e in [-1, 1]^m, pushed forwards.

The input box is the zonotope with one generator per pixel (half its width). Affine ops
are exact on zonotopes (the centre through the op, the generators through its linear
part). A ReLU on the zonotope's own bounds [l, u] (c -+ sum |G|) is exact where stable and,
where l < 0 < u, the paper's transformer: y = lambda x + mu + mu e_new with
lambda = u / (u - l), mu = -lambda l / 2 (one new generator per unstable neuron). A spec
row's bound is C c - sum |C G|. Sequential ReLU networks only.
"""

from __future__ import annotations

import torch

from aisafety.verification.base import Verifier
from aisafety.verification.deadline import check_time
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box, Op
from aisafety.verification.property import Property

ZONOTOPE_KINDS = {"input", "dense", "conv", "elementwise", "reshape", "positive-linear",
                  "activation"}  # fmt: skip

Zonotope = tuple[torch.Tensor, torch.Tensor]  # centre (B, *shape), generators (B, m, *shape)


def input_zonotope(lower: torch.Tensor, upper: torch.Tensor) -> Zonotope:
    b, n = lower.shape[0], lower[0].numel()
    radius = ((upper - lower) / 2).reshape(b, n)
    generators = torch.diag_embed(radius).reshape(b, n, *lower.shape[1:])
    return (upper + lower) / 2, generators


def affine(op: Op, zonotope: Zonotope) -> Zonotope:
    """Exact: the centre through ``op``, the generators through its linear part."""
    centre, generators = zonotope
    b, m = generators.shape[:2]
    offset = op.forward(torch.zeros_like(centre[:1]))
    moved = op.forward(generators.reshape(b * m, *generators.shape[2:])) - offset
    return op.forward(centre), moved.reshape(b, m, *moved.shape[1:])


def concretize(zonotope: Zonotope) -> tuple[torch.Tensor, torch.Tensor]:
    centre, generators = zonotope
    spread = generators.abs().sum(1)
    return centre - spread, centre + spread


def relu(zonotope: Zonotope, known: Box | None = None) -> Zonotope:
    """DeepZ's ReLU transformer (exact where stable, one new generator per unstable), on
    the zonotope's bounds intersected with ``known`` sound ones (RefineZono's)."""
    centre, generators = zonotope
    lower, upper = concretize(zonotope)
    if known is not None:
        lower, upper = torch.maximum(lower, known[0]), torch.minimum(upper, known[1])
    unstable = (lower < 0) & (upper > 0)
    active = (lower >= 0).to(lower.dtype)
    slope = torch.where(unstable, upper / (upper - lower).clamp(min=1e-300), active)
    shift = torch.where(unstable, -slope * lower / 2, torch.zeros_like(lower))
    b = centre.shape[0]
    new = unstable.reshape(b, -1).any(0).nonzero().flatten()  # any sample's unstable neurons
    fresh = centre.new_zeros(b, len(new), centre[0].numel())
    fresh[:, torch.arange(len(new)), new] = shift.reshape(b, -1)[:, new]
    fresh = fresh.reshape(b, len(new), *centre.shape[1:])
    scaled = generators * slope.unsqueeze(1).to(generators.dtype)
    return centre * slope + shift, torch.cat([scaled, fresh], 1)


def output_zonotope(graph: BoundGraph, lower: torch.Tensor, upper: torch.Tensor) -> Zonotope:
    zonotope = input_zonotope(lower, upper)
    for op in graph.ops[1:]:
        check_time()
        zonotope = relu(zonotope) if op.kind == "activation" else affine(op, zonotope)
    return zonotope


def spec_bounds(graph: BoundGraph, prop: Property, zonotope: Zonotope) -> torch.Tensor:
    """min of each row ``C f`` over the output zonotope: C c - sum |C G|."""
    centre, generators = zonotope
    spec = prop.spec.to(centre.dtype)
    rows = spec @ centre.flatten(1).unsqueeze(2)  # (B, K, 1)
    spread = (generators.flatten(2) @ spec.transpose(1, 2)).abs().sum(1)  # (B, K)
    return rows.squeeze(2) - spread


class DeepZVerifier(Verifier):
    name = "deepz"
    description = (
        "DeepZ (Singh et al. 2018): zonotopes forwards, the minimal-area parallelogram for "
        "each unstable ReLU; sequential ReLU networks"
    )
    kinds = ZONOTOPE_KINDS

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        graph.require_sequential(self.name)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        zonotope = output_zonotope(graph, prop.lower, prop.upper)
        return spec_bounds(graph, prop, zonotope), None
