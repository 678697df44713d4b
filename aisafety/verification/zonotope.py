"""DeepZ (Singh et al. 2018): zonotopes x = c + G e + d, e in [-1, 1]^m, |d| <= r, pushed
forwards.

The input box is the zonotope with one generator per pixel (half its width). Affine ops
are exact on zonotopes (the centre through the op, the generators through its linear
part). A ReLU on the zonotope's own bounds [l, u] (c -+ sum |G|) is exact where stable and,
where l < 0 < u, the paper's transformer: y = lambda x + mu + mu e_new with
lambda = u / (u - l), mu = -lambda l / 2 (one new generator per unstable neuron). A spec
row's bound is C c - sum |C G|. Sequential ReLU networks only.

In float64 (every verifier's graph) each step rounds to nearest, so the computed zonotope
can miss the exact image by a few ulps (up to 1.6e-13 on a 12-input net's bound;
docs/certification.md). ``r``, per neuron, holds the rounding so far, bounded with
``float64_margin``'s rule (``factor(n)`` times the sum of the absolute terms): it moves
through an affine op as ``|W| r``, a ReLU's parallelogram takes the height
``max(-lambda l, (1 - lambda) u)`` of the computed ``lambda`` (rounded up), and every bound
subtracts it. A float32 zonotope keeps ``r = 0`` (``float64_margin.applies``).

Every step needs the generators' absolute sum per neuron, ``s = sum |G|`` (the bounds, and
the size of each op's rounding), so the zonotope carries it instead of each op summing its
input again (1.22x DeepZ's time on 256x2 when it did; docs/certification.md): the input's
is its radius (one generator per pixel), an affine op sums its output's once, and a ReLU's
is ``lambda s + mu``, raised by the rounding bound of that and of the sum it replaces, so it
is never below the exact sum of the computed generators.
"""

from __future__ import annotations

import torch

from aisafety.verification import float64_margin as fm
from aisafety.verification.base import Verifier
from aisafety.verification.deadline import check_time
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ibp_rounding import U64
from aisafety.verification.ops import Box, Op
from aisafety.verification.property import Property

ZONOTOPE_KINDS = {"input", "dense", "conv", "elementwise", "reshape", "positive-linear",
                  "activation"}  # fmt: skip

# centre (B, *shape), generators (B, m, *shape), rounding radius (B, *shape), and the
# generators' absolute sum (B, *shape): computed, or above the exact sum (a ReLU's)
Zonotope = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def input_zonotope(lower: torch.Tensor, upper: torch.Tensor) -> Zonotope:
    b, n = lower.shape[0], lower[0].numel()
    centre, radius = (upper + lower) / 2, (upper - lower) / 2
    generators = torch.diag_embed(radius.reshape(b, n)).reshape(b, n, *lower.shape[1:])
    return centre, generators, fm.slack(2, centre.abs() + radius), radius


def _linear(op: Op, x: torch.Tensor) -> torch.Tensor:
    """``op``'s linear part (no constant) on a batch of generators."""
    if op.kind == "dense":
        return torch.nn.functional.linear(x, op.weight)
    if op.kind == "conv":
        return op.conv(x, op.weight, None)
    if op.kind == "elementwise":
        return x * op.scale
    return op.forward(x)  # reshape, positive-linear: no constant


def affine(op: Op, zonotope: Zonotope) -> Zonotope:
    """Exact up to rounding: the centre through ``op``, the generators through its linear
    part, the rounding radius through ``|op|`` plus this op's rounding."""
    centre, generators, radius, spread = zonotope
    b, m = generators.shape[:2]
    moved = _linear(op, generators.reshape(b * m, *generators.shape[2:]))
    moved = moved.reshape(b, m, *moved.shape[1:])
    size = fm.through(op, centre.abs()) + fm.through(op, spread + radius, constant=False)
    outward = fm.through(op, radius, constant=False) + fm.slack(centre[0].numel() + m + 2, size)
    return op.forward(centre), moved, outward, moved.abs().sum(1)


def concretize(zonotope: Zonotope) -> tuple[torch.Tensor, torch.Tensor]:
    centre, generators, radius, spread = zonotope
    return _bounds(centre, spread, radius, generators.shape[1])


def _bounds(centre: torch.Tensor, spread: torch.Tensor, radius: torch.Tensor, m: int) -> Box:
    """``c -+ (spread + r)``, widened by the rounding of the ``m`` generators' sum."""
    outward = radius + fm.slack(m + 2, centre.abs() + spread + radius)
    return centre - spread - outward, centre + spread + outward


def relu(zonotope: Zonotope, known: Box | None = None) -> Zonotope:
    """DeepZ's ReLU transformer (exact where stable, one new generator per unstable), on
    the zonotope's bounds intersected with ``known`` sound ones (RefineZono's).

    For any ``lambda`` in [0, 1], ``relu(x) - lambda x`` is convex on [l, u] with ends
    ``-lambda l`` and ``(1 - lambda) u`` and 0 at 0, so it lies in [0, h] with
    ``h = max(-lambda l, (1 - lambda) u)``: the parallelogram of the computed ``lambda``
    is sound with ``mu = h / 2`` (h rounded up), equal to the paper's for the exact one."""
    centre, generators, radius, spread = zonotope
    m = generators.shape[1]
    lower, upper = _bounds(centre, spread, radius, m)
    if known is not None:
        lower, upper = torch.maximum(lower, known[0]), torch.minimum(upper, known[1])
    unstable = (lower < 0) & (upper > 0)
    active = (lower >= 0).to(lower.dtype)
    slope = torch.where(unstable, upper / (upper - lower).clamp(min=1e-300), active)
    height = torch.maximum(-slope * lower, (1 - slope) * upper)
    if fm.applies(height):
        height = height * (1 + 8 * U64) + fm.TINY
    shift = torch.where(unstable, height / 2, torch.zeros_like(lower))
    b = centre.shape[0]
    new = unstable.reshape(b, -1).any(0).nonzero().flatten()  # any sample's unstable neurons
    fresh = centre.new_zeros(b, len(new), centre[0].numel())
    fresh[:, torch.arange(len(new)), new] = shift.reshape(b, -1)[:, new]
    fresh = fresh.reshape(b, len(new), *centre.shape[1:])
    scaled = generators * slope.unsqueeze(1).to(generators.dtype)
    # stable neurons are exact (slope 0 or 1, no shift); an unstable one rounds its centre
    # (a product and a sum) and each generator's product
    size = slope * (centre.abs() + spread + radius) + shift
    rounding = torch.where(unstable, fm.slack(2, size), torch.zeros_like(size))
    out = (centre * slope + shift, torch.cat([scaled, fresh], 1), slope * radius + rounding)
    return (*out, _carried(slope * spread + shift, m))


def _carried(spread: torch.Tensor, m: int) -> torch.Tensor:
    """A ReLU's output sum ``lambda s + mu`` from its input's computed sum ``s`` of ``m``
    terms: the exact sum of the computed generators exceeds it by at most the rounding of
    ``s`` (``gamma(m - 1)``), of each product ``lambda g`` and of this expression (a few
    ``u``); ``fm.slack(m + 2)`` is ``2 gamma(2 m + 12)`` of it, above all of these."""
    return spread + fm.slack(m + 2, spread)


def output_zonotope(graph: BoundGraph, lower: torch.Tensor, upper: torch.Tensor) -> Zonotope:
    zonotope = input_zonotope(lower, upper)
    for op in graph.ops[1:]:
        check_time()
        zonotope = relu(zonotope) if op.kind == "activation" else affine(op, zonotope)
    return zonotope


def spec_bounds(graph: BoundGraph, prop: Property, zonotope: Zonotope) -> torch.Tensor:
    """min of each row ``C f`` over the output zonotope: C c - sum |C G| - |C| r, less
    the rounding of these sums."""
    centre, generators, radius, sums = zonotope
    spec = prop.spec.to(centre.dtype)
    rows = spec @ centre.flatten(1).unsqueeze(2)  # (B, K, 1)
    spread = (generators.flatten(2) @ spec.transpose(1, 2)).abs().sum(1)  # (B, K)
    # the rows' products and sums, the sum over generators, and the rounding radius
    terms = centre.abs() + sums + radius
    size = (spec.abs() @ terms.flatten(1).unsqueeze(2)).squeeze(2) + spread
    outward = (spec.abs() @ radius.flatten(1).unsqueeze(2)).squeeze(2)
    n = centre[0].numel() + generators.shape[1] + 2
    return rows.squeeze(2) - spread - outward - fm.slack(n, size)


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
        self.require_float64(graph, prop)
        zonotope = output_zonotope(graph, prop.lower, prop.upper)
        return spec_bounds(graph, prop, zonotope), None
