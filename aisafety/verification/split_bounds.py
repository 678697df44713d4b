"""Bounds of a batch of ReLU-split domains: beta-CROWN (Wang et al. 2021).

A domain is one spec row of one sample with some unstable ReLUs fixed: ``+1`` (z >= 0,
the ReLU is the identity) or ``-1`` (z <= 0, it is zero). Its bound is CROWN's backward
pass on the root's intermediate boxes, each split neuron's box cut to its half (so its
relaxation is exact), with

* alpha: a lower slope in [0, 1] per domain and unstable ReLU (alpha-CROWN), and
* beta: a multiplier >= 0 per domain and split neuron for its constraint ``s z >= 0``;
  the pass bounds ``row - sum beta s z``, which is <= the row wherever the splits hold,
  so its minimum over the box is a lower bound of the row on the domain (Lagrangian
  duality; any beta >= 0 is sound, the optimised one is tight).

Both are optimised by Adam on the bound in float32; the result is the bound of the best
multipliers recomputed by a rounding-safe pass (``sound_split_bound``: float32 with every
rounding error subtracted, as CROWN's ``bounds.sound_backward``), so the search's
precision decides only tightness. The root boxes are valid on every domain (they hold on the whole
box), and cutting a split neuron's box to its half is valid where its split holds; IBP is
re-run after the cuts and intersected, which is sound for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aisafety.verification import bounds, budget, float32_rounding, float64_margin, rounding
from aisafety.verification.bounds import (
    concretize,
    forward_from,
    in_chunks,
    linear_boxes,
    sound_backward,
)
from aisafety.verification.deadline import check_time
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.relaxations import RELU, relu_default_slope


@dataclass
class Domains:
    """D domains of one sample: row spec (D, 1, outputs), offset (D,), the row's index (D,),
    input box (D, *in), per ReLU node (by its index in the graph) the splits (D, n) in
    {-1, 0, 1}, slopes alpha (D, 1, n) and multipliers beta (D, 1, n), and the last bound
    (D,)."""

    spec: torch.Tensor
    offset: torch.Tensor
    row: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    splits: dict[int, torch.Tensor]
    alpha: dict[int, torch.Tensor]
    beta: dict[int, torch.Tensor]
    bound: torch.Tensor
    branch: torch.Tensor | None = None  # (D, 2): the (node, index) chosen to split next

    def __len__(self) -> int:
        return len(self.offset)

    def take(self, index: torch.Tensor) -> Domains:
        pick = lambda d: {i: t[index] for i, t in d.items()}  # noqa: E731
        return Domains(self.spec[index], self.offset[index], self.row[index], self.lower[index],
                       self.upper[index], pick(self.splits), pick(self.alpha), pick(self.beta),
                       self.bound[index],
                       None if self.branch is None else self.branch[index])  # fmt: skip

    @staticmethod
    def cat(parts: list[Domains]) -> Domains:
        parts = [p for p in parts if len(p)]
        join = lambda key: {i: torch.cat([getattr(p, key)[i] for p in parts])  # noqa: E731
                            for i in getattr(parts[0], key)}  # fmt: skip
        return Domains(*(torch.cat([getattr(p, k) for p in parts])
                         for k in ("spec", "offset", "row", "lower", "upper")),
                       join("splits"), join("alpha"), join("beta"),
                       torch.cat([p.bound for p in parts]),
                       None if any(p.branch is None for p in parts)
                       else torch.cat([p.branch for p in parts]))  # fmt: skip


def relu_nodes(graph: BoundGraph) -> list[int]:
    """Indices of the ReLU ops, in graph order."""
    return [
        i for i, op in enumerate(graph.ops) if op.kind == "activation" and op.relaxation is RELU
    ]


def domain_boxes(
    graph: BoundGraph,
    root: list[Box],
    domains: Domains,
    input_split: bool = False,
    intermediate: bool = False,
) -> list[Box]:
    """The root boxes (a batch of one, or one per domain) per domain, split neurons cut to
    their half, IBP re-run after each cut and intersected. With ``input_split`` each
    domain's own input box gets its own CROWN boxes, intersected with the root's. With
    ``intermediate`` the input box of every ReLU layer after the first split one is
    bounded again by CROWN per domain, on the cut boxes before it (beta-CROWN's
    per-domain intermediate bounds): a split makes the layers after it tighter."""
    d = len(domains)
    boxes = [(lo.expand(d, *lo.shape[1:]), hi.expand(d, *hi.shape[1:])) for lo, hi in root]
    if input_split:
        own = linear_boxes(graph, domains.lower, domains.upper)
        boxes = [(torch.maximum(a, c), torch.minimum(b, e))
                 for (a, b), (c, e) in zip(boxes, own, strict=True)]  # fmt: skip
        boxes[0] = (domains.lower, domains.upper)
    split_before = False
    for i in relu_nodes(graph):
        j = graph.ops[i].inputs[0]
        if intermediate and split_before:
            boxes[j] = tighten(graph, j, boxes)
        lo, hi = boxes[j]
        s = domains.splits[i].reshape(lo.shape)
        split_before = split_before or bool((s != 0).any())
        lo = torch.where(s > 0, lo.clamp(min=0), lo)
        boxes[j] = (lo, torch.where(s < 0, hi.clamp(max=0), hi))
        boxes = forward_from(graph, boxes, j)
    return boxes


# an empty box prunes only when its ends cross by more than this, relative to their size:
# far above the float64 rounding of the boxes' IBP (about n u |W| |z|, 1e-13 here)
EMPTY_GAP = 1e-6


def empty_domains(boxes: list[Box]) -> torch.Tensor:
    """(D,) True where a node's box (one per domain, ``domain_boxes``) is empty: its lower
    end above its upper by more than ``EMPTY_GAP``. Every box holds every value its node
    takes on the points of the box that satisfy the domain's splits, so an empty one means
    there is no such point: the domain is infeasible and its row holds there vacuously."""
    d = boxes[0][0].shape[0]
    empty = torch.zeros(d, dtype=torch.bool)
    for lo, hi in boxes:
        lo, hi = lo.reshape(lo.shape[0], -1), hi.reshape(hi.shape[0], -1)
        gap = lo - hi - EMPTY_GAP * (1 + lo.abs() + hi.abs())
        empty = empty | (gap > 0).any(1).expand(d)
    return empty


def tighten(graph: BoundGraph, j: int, boxes: list[Box]) -> Box:
    """Node ``j``'s per-domain box intersected with CROWN's bounds of its neurons that are
    unstable in some domain (``bounds.sound_backward``: rounding-safe, in row chunks sized
    to the memory budget)."""
    lo, hi = boxes[j]
    d = lo.shape[0]
    flat_lo, flat_hi = lo.reshape(d, -1), hi.reshape(d, -1)
    wanted = torch.nonzero(((flat_lo < 0) & (flat_hi > 0)).any(0)).flatten()
    m = len(wanted)
    if m == 0:
        return lo, hi
    eye = lo.new_zeros(d, m, flat_lo.shape[1])
    eye[:, torch.arange(m), wanted] = 1.0
    a = torch.cat([eye, -eye], 1).reshape(d, 2 * m, *lo.shape[1:])
    pass_ = lambda rows, part: sound_backward(graph, j, rows, part, cast=False, rows=2 * m)  # noqa: E731
    bound = in_chunks(graph, j, a, boxes, False, pass_)[0].to(lo.dtype)
    new_lo, new_hi = flat_lo.clone(), flat_hi.clone()
    new_lo[:, wanted] = flat_lo[:, wanted].maximum(bound[:, :m])
    new_hi[:, wanted] = flat_hi[:, wanted].minimum(-bound[:, m:])
    return new_lo.reshape(lo.shape), new_hi.reshape(hi.shape)


def split_backward(
    graph: BoundGraph,
    domains: Domains,
    boxes: list[Box],
    alpha: dict[int, torch.Tensor],
    beta: dict[int, torch.Tensor],
    rounded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Lower bound (D,) of each domain's row minus sum beta s z, its input coefficients
    (D, 1, *in), and the coefficient reaching each ReLU's output (for branching).

    ``rounded``: a float32 pass (``rounding.fast_graph``, outward-rounded boxes) whose
    bound, float64, has every rounding error subtracted, as ``bounds.backward`` does; the
    subtraction of ``beta s`` is one more float32 addition (``rounding.sum_error``). A
    float64 pass subtracts its own rounding margin (``float64_margin.py``, as
    ``bounds.backward``'s), the subtraction of ``beta s`` one more float64 addition; a
    float32 pass without ``rounded`` is the search's objective and keeps none."""
    last = len(graph.ops) - 1
    a = domains.spec.reshape(len(domains), 1, *graph.ops[-1].out_shape)
    margin = not rounded and float64_margin.applies(a)
    f32 = float32_rounding.active() and (rounded or margin)
    pending = {last: a}
    bias = a.new_zeros(a.shape[:2], dtype=torch.float64 if rounded else a.dtype)
    slack, size = bias.new_zeros(()), bias.new_zeros(())
    at_relu: dict[int, torch.Tensor] = {}
    cut = {graph.ops[i].inputs[0]: i for i in relu_nodes(graph)}
    for i in range(last, 0, -1):
        if i not in pending:
            continue
        check_time()
        op, coeff = graph.ops[i], pending.pop(i)
        if i in cut:  # the split constraints' term: - beta s z
            k = cut[i]
            shift = beta[k] * domains.splits[k].unsqueeze(1).to(beta[k].dtype)
            coeff = coeff - shift.reshape(coeff.shape)
            if rounded:
                slack = slack + rounding.sum_error(coeff, boxes[i])
            elif margin:
                slack = slack + float64_margin.sum_slack(coeff, boxes[i])
        in_boxes = [boxes[j] for j in op.inputs]
        if op.kind == "activation":
            at_relu[i] = coeff
            slope = alpha.get(i)
            if slope is None and op.relaxation is RELU:
                slope = relu_default_slope(*in_boxes[0], "adaptive")
            elif slope is not None:
                slope = slope.reshape(coeff.shape)
            back, shift = op.backward(coeff, *in_boxes, lower_slope=slope, constant=not rounded)
        else:
            back, shift = op.backward(coeff, *in_boxes)
        if rounded:
            shift, err = rounding.exact_shift(graph.wide.ops[i], coeff, back, in_boxes)
            slack, size = slack + err, size + shift.abs()
        elif margin:
            slack, size = slack + float64_margin.op_slack(op, coeff, in_boxes), size + shift.abs()
        if f32:  # the float32 network's own rounding at this op (``bounds.backward``)
            wide = graph.wide.ops[i] if rounded else op
            slack = slack + float32_rounding.slack(wide, coeff, in_boxes)
        bias = bias + shift
        for j, c in zip(op.inputs, back, strict=True):
            if j not in pending:
                pending[j] = c
                continue
            pending[j] = pending[j] + c
            if rounded:
                slack = slack + rounding.sum_error(pending[j], boxes[j])
            elif margin:
                slack = slack + float64_margin.sum_slack(pending[j], boxes[j])
    coeff = pending.get(0, a.new_zeros(*a.shape[:2], *graph.input_shape))
    if margin:  # float64 sums: a constant and up to three margins per op
        value = concretize(coeff, boxes[0]) + bias
        bound = float64_margin.lower(value, coeff, boxes[0], size, slack, last + 4, graph.ops)
        total = bound[:, 0] + domains.offset  # one more rounding: 2 u |total| covers it
        return total - 2 * rounding.U64 * total.abs(), coeff, at_relu
    if not rounded:
        bound = concretize(coeff, boxes[0]) + bias
        return bound[:, 0] + domains.offset, coeff, at_relu
    value, err = rounding.concretise(coeff, boxes[0])
    terms = 2 * last + 4  # float64 sums: a constant and a margin per op, the splits' terms
    sums = rounding.gamma(terms, rounding.U64) * (size + value.abs() + slack)
    bound = value + bias - (slack + err + sums) * (1 + 4 * rounding.U64)
    total = bound[:, 0] + domains.offset
    return total - 2 * rounding.U64 * total.abs(), coeff, at_relu


def sound_split_bound(
    graph: BoundGraph,
    domains: Domains,
    boxes: list[Box],
    alpha: dict[int, torch.Tensor],
    beta: dict[int, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """``split_backward``'s bound that prunes: float32 with its rounding margin where
    ``rounding.fast_graph`` allows (a float32-exact ReLU graph, a large enough pass, a spec
    float32 holds exactly), else in the graph's dtype (float64), as ``bounds.sound_backward``
    decides for CROWN. Coefficients come back in the graph's dtype."""
    widest = max(budget.numel(op.out_shape) for op in graph.ops)
    fast = rounding.fast_graph(graph, len(domains) * widest)
    exact_spec = torch.equal(domains.spec.float().double(), domains.spec.double())
    if fast is None or not exact_spec:
        cast = lambda d: {i: t.to(graph.dtype) for i, t in d.items()}  # noqa: E731
        return split_backward(graph, domains, boxes, cast(alpha), cast(beta))
    narrow = [rounding.outward(box) for box in boxes]
    mine = Domains(domains.spec.float(), domains.offset, domains.row, *narrow[0],
                   domains.splits, {}, {}, domains.bound)  # fmt: skip
    f32 = lambda d: {i: t.float() for i, t in d.items()}  # noqa: E731
    bound, coeff, at_relu = split_backward(fast, mine, narrow, f32(alpha), f32(beta), True)
    return bound, coeff.to(graph.dtype), at_relu


def bound_domains(
    graph: BoundGraph,
    root: list[Box],
    domains: Domains,
    steps: int,
    lr: float,
    input_split: bool = False,
    intermediate: bool = False,
    lr_alpha: float | None = None,
    keep_last: bool = False,
) -> tuple[Domains, torch.Tensor, dict[int, torch.Tensor], list[Box]]:
    """``domains`` with their bound (and best alpha, beta) after ``steps`` of Adam (``lr``
    on beta, ``lr_alpha`` on alpha, the same when None); their input coefficients, the
    coefficients at the ReLU outputs and their boxes. With ``keep_last`` the domains keep
    Adam's last alpha and beta instead, to resume from (the bound stays the best's): on
    domains whose multipliers must grow far (splits the relaxation finds contradictory)
    the bound can fall for dozens of steps before it rises, so the best is often the
    start, and resuming from it would repeat the same steps."""
    boxes = domain_boxes(graph, root, domains, input_split, intermediate)
    search = graph.in_dtype(bounds.SEARCH_DTYPE) if graph.dtype == torch.float64 else graph
    cast = search.dtype
    s_boxes = [(lo.to(cast), hi.to(cast)) for lo, hi in boxes]
    s_dom = Domains(domains.spec.to(cast), domains.offset.to(cast), domains.row, *s_boxes[0],
                    domains.splits, {}, {}, domains.bound)  # fmt: skip
    alpha = {i: t.to(cast).clone().requires_grad_(True) for i, t in domains.alpha.items()}
    beta = {i: t.to(cast).clone().requires_grad_(True) for i, t in domains.beta.items()}
    chosen_a = {i: t.detach().clone() for i, t in alpha.items()}
    chosen_b = {i: t.detach().clone() for i, t in beta.items()}
    top = torch.full((len(domains),), -torch.inf, dtype=cast)
    if steps > 0 and (alpha or beta):  # no slope and no split: nothing to optimise
        alpha_lr = lr if lr_alpha is None else lr_alpha
        groups = [{"params": list(beta.values())},
                  {"params": list(alpha.values()), "lr": alpha_lr}]  # fmt: skip
        optimiser = torch.optim.Adam(groups, lr=lr)
        for _ in range(steps):
            with torch.enable_grad():
                bound, _, _ = split_backward(search, s_dom, s_boxes, alpha, beta)
                optimiser.zero_grad()
                (-bound.sum()).backward()
            better = bound.detach() > top
            top = torch.where(better, bound.detach(), top)
            for mine, chosen in ((alpha, chosen_a), (beta, chosen_b)):
                for i, t in mine.items():
                    chosen[i] = torch.where(better.reshape(-1, 1, 1), t.detach(), chosen[i])
            if bool((top > 0).all()):  # every domain proved: more steps change nothing
                break
            optimiser.step()
            with torch.no_grad():
                for t in alpha.values():
                    t.clamp_(0, 1)
                for t in beta.values():
                    t.clamp_(min=0)
    with torch.no_grad():
        bound, coeff, at_relu = sound_split_bound(graph, domains, boxes, chosen_a, chosen_b)
    if keep_last:
        chosen_a = {i: t.detach().clone() for i, t in alpha.items()}
        chosen_b = {i: t.detach().clone() for i, t in beta.items()}
    done = Domains(domains.spec, domains.offset, domains.row, domains.lower, domains.upper,
                   domains.splits, chosen_a, chosen_b, bound)  # fmt: skip
    return done, coeff, at_relu, boxes


def cheap_bounds(graph: BoundGraph, boxes: list[Box], domains: Domains) -> torch.Tensor:
    """One beta-CROWN pass (D,) in the search dtype with the domains' own alpha and beta,
    on ``boxes`` (one per domain) cut to their splits: FSB's estimate of a split, used
    to choose a branch, never to prune."""
    search = graph.in_dtype(bounds.SEARCH_DTYPE) if graph.dtype == torch.float64 else graph
    cast = search.dtype
    cut = domain_boxes(graph, boxes, domains)
    cut = [(lo.to(cast), hi.to(cast)) for lo, hi in cut]
    mine = Domains(domains.spec.to(cast), domains.offset.to(cast), domains.row, *cut[0],
                   domains.splits, {}, {}, domains.bound)  # fmt: skip
    alpha = {i: t.to(cast) for i, t in domains.alpha.items()}
    beta = {i: t.to(cast) for i, t in domains.beta.items()}
    with torch.no_grad():
        return split_backward(search, mine, cut, alpha, beta)[0]


def root_domains(
    graph: BoundGraph,
    root: list[Box],
    spec: torch.Tensor,
    offset: torch.Tensor,
    rows,
    slopes: dict[int, torch.Tensor] | None = None,
) -> Domains:
    """One domain per spec row (spec (K, outputs), offset (K,), their indices ``rows``):
    no split, the rows' ``slopes`` (per ReLU (K, *shape), e.g. the root's optimised ones)
    or CROWN's."""
    k = len(offset)
    splits, alpha, beta = {}, {}, {}
    for i in relu_nodes(graph):
        lo, hi = root[graph.ops[i].inputs[0]]
        flat_lo, flat_hi = lo.reshape(1, -1), hi.reshape(1, -1)
        n = flat_lo.shape[1]
        splits[i] = torch.zeros(k, n, dtype=torch.int8)
        if slopes is not None and i in slopes:
            alpha[i] = slopes[i].reshape(k, 1, n).to(bounds.SEARCH_DTYPE).clone()
        else:
            alpha[i] = relu_default_slope(flat_lo, flat_hi, "adaptive").expand(k, n)
            alpha[i] = alpha[i].unsqueeze(1).to(bounds.SEARCH_DTYPE).clone()
        beta[i] = torch.zeros(k, 1, n, dtype=bounds.SEARCH_DTYPE)
    lower, upper = root[0]
    return Domains(spec.unsqueeze(1), offset, torch.as_tensor(rows),
                   lower.expand(k, *lower.shape[1:]), upper.expand(k, *upper.shape[1:]),
                   splits, alpha, beta,
                   torch.full((k,), -torch.inf, dtype=offset.dtype))  # fmt: skip
