"""Bound propagation on a ``BoundGraph``: intervals forwards, linear bounds backwards.

A property is a box ``[lower, upper]`` of inputs and a spec ``C`` of shape
``(B, K, outputs)``: it holds when every row of ``C f(x)`` is positive on the box. Every
function here returns *lower* bounds of those rows; an upper bound of ``A z`` is
``-lower(-A z)``.

* IBP (Gowal et al. 2018): boxes forwards; the spec is folded into the last affine op
  ("elision"), which is tighter than subtracting output intervals.
* CROWN (Zhang et al. 2018): ``backward`` pushes ``A`` from a node to the input through
  every op's backward rule (exact for affine ops, relaxed for activations) and
  concretises it on the input box. Bounds of each activation's input come from the same
  backward pass started at that node, so a deeper layer uses tighter intermediate
  bounds. Fast-Lin (Weng et al. 2018) is the same pass with the parallel ReLU lower line.
* CROWN-IBP (Zhang et al. 2020): IBP's intermediate boxes, CROWN at the output.
* alpha-CROWN (Xu et al. 2021): the lower slopes of unstable ReLUs, one per output row,
  are optimised by projected gradient ascent on the bound (every slope in [0, 1] is sound).

Every intermediate box is intersected with IBP's, and every final bound is the largest of
the method's and IBP's (both are sound, so the larger one is too); this keeps the ordering
IBP <= CROWN-IBP, CROWN <= alpha-CROWN on every sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from aisafety.verification import budget, float32_rounding, float64_margin, receptive, rounding
from aisafety.verification.deadline import check_time
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.ops import Box, split_signs
from aisafety.verification.relaxations import RELU, SShapeRelaxation, relu_default_slope

# the dtype of alpha-CROWN's slope search on a float64 graph (its result is re-bounded in
# float64, so this decides speed and tightness, never soundness)
SEARCH_DTYPE = torch.float32
STOP_ABS, STOP_REL = 0.02, 0.01  # the output search's early stop margin (``stop_lead``)

LINEAR_KINDS = {"input", "dense", "conv", "elementwise", "reshape", "positive-linear", "add",
                "activation"}  # fmt: skip
# with max-pooling (ops.MaxPool: DeepPoly's lines; milp_maxpool.py: the MILP and LP rows)
CROWN_KINDS = LINEAR_KINDS | {"maxpool"}
IBP_KINDS = CROWN_KINDS
# the ops of a receptive-field crop graph too (``receptive.py``: a residual branch's window)
PASS_KINDS = CROWN_KINDS | {"window"}


def interval_boxes(graph: BoundGraph, lower: torch.Tensor, upper: torch.Tensor) -> list[Box]:
    """The IBP box of every node (of the float32 network's values inside
    ``float32_rounding.rigorous()``)."""
    boxes: list[Box] = [(lower, upper)]
    for op in graph.ops[1:]:
        boxes.append(float32_rounding.interval(op, [boxes[i] for i in op.inputs]))
    return boxes


def concretize(a: torch.Tensor, box: Box) -> torch.Tensor:
    """min of ``A z`` over the box (B, K): ``max(A, 0) l + min(A, 0) u`` as two batched
    matrix-vector products, the same products and sums as the elementwise form in another
    order (``float64_margin.concretise_margin`` holds for any order) without its product
    temporaries: 1.7-2x faster on 8 x 512 rows of 784 (docs/certification.md). The order
    depends on the batch in the last bits (``bmm`` of one matrix takes another path), as
    every GEMM of a pass does already."""
    dtype = torch.promote_types(a.dtype, box[0].dtype)
    b = max(a.shape[0], box[0].shape[0])
    rows = a.flatten(2).to(dtype).expand(b, -1, -1)
    lo, hi = (t.reshape(t.shape[0], -1, 1).to(dtype).expand(b, -1, -1) for t in box)
    pos, neg = split_signs(rows)
    return (torch.bmm(pos, lo) + torch.bmm(neg, hi)).squeeze(2)


def backward(
    graph: BoundGraph,
    start: int,
    a: torch.Tensor,
    boxes: list[Box],
    mode: str = "adaptive",
    slopes: dict[int, torch.Tensor] | None = None,
    rounded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower bound (B, K) of ``A node_start`` over the input box, and A's input coefficients.

    ``rounded``: a float32 pass on float32 ``boxes`` whose bound (float64) has every
    rounding error of the pass subtracted (``rounding.py``); callers use ``sound_backward``.
    Inside ``float32_rounding.rigorous()`` each op's float32 rounding is subtracted too."""
    f32 = float32_rounding.active() and (rounded or float64_margin.applies(a))
    pending = {start: a}
    bias = a.new_zeros(a.shape[:2], dtype=torch.float64 if rounded else a.dtype)
    slack, size = bias.new_zeros(()), bias.new_zeros(())
    margin = not rounded and float64_margin.applies(a)  # float64: its own rounding margin
    for i in range(start, 0, -1):
        if i not in pending:
            continue
        check_time()  # a verifier's per-instance limit (deadline.py); no-op otherwise
        op, coeff = graph.ops[i], pending.pop(i)
        in_boxes = [boxes[j] for j in op.inputs]
        if op.kind == "activation":
            slope = (slopes or {}).get(i)
            if slope is None and op.relaxation is RELU:
                slope = relu_default_slope(*in_boxes[0], mode)
            # rounded: exact_shift computes the constant in float64
            back, shift = op.backward(coeff, *in_boxes, lower_slope=slope, constant=not rounded)
        elif rounded and op.kind in {"dense", "conv", "maxpool"}:  # exact_shift: the constant
            back, shift = op.backward(coeff, *in_boxes, constant=False)
        elif op.kind in PASS_KINDS:
            back, shift = op.backward(coeff, *in_boxes)
        else:
            raise VerificationError(
                f"linear bounds cannot pass {op.kind} node {op.name!r} of model {graph.model!r}"
            )
        if rounded:
            shift, err = rounding.exact_shift(graph.wide.ops[i], coeff, back, in_boxes)
            slack, size = slack + err, size + shift.abs()
        elif margin:
            slack, size = slack + float64_margin.op_slack(op, coeff, in_boxes), size + shift.abs()
        if f32:  # the float32 network's own rounding at this op: A r >= -<|A|, e>
            wide = graph.wide.ops[i] if rounded else op
            slack = slack + float32_rounding.slack(wide, coeff, in_boxes)
        bias = bias + shift
        for j, c in zip(op.inputs, back, strict=True):
            if j not in pending:
                pending[j] = c
                continue
            pending[j] = pending[j] + c
            if rounded:  # the float32 addition rounds too
                slack = slack + rounding.sum_error(pending[j], boxes[j])
            elif margin:  # one rounding of each sum, at most u |sum| |z|
                slack = slack + float64_margin.sum_slack(pending[j], boxes[j])
    coeff = pending[0] if 0 in pending else a.new_zeros(*a.shape[:2], *graph.input_shape)
    if margin:  # the float64 sums of the constants and of the margins: start + 2 terms at most
        value = concretize(coeff, boxes[0]) + bias
        ops = graph.ops[: start + 1]
        return float64_margin.lower(value, coeff, boxes[0], size, slack, start + 4, ops), coeff
    if not rounded:
        return concretize(coeff, boxes[0]) + bias, coeff
    value, err = rounding.concretise(coeff, boxes[0])
    # the float64 sums of the bias and of the margins round too (start + 2 terms at most)
    total = value + bias
    sums = rounding.gamma(start + 4, rounding.U64) * (size + value.abs() + slack)
    return total - (slack + err + sums) * (1 + 4 * rounding.U64), coeff


def sound_backward(
    graph: BoundGraph,
    start: int,
    a: torch.Tensor,
    boxes: list[Box],
    mode: str = "adaptive",
    slopes: dict[int, torch.Tensor] | None = None,
    cast: bool = True,
    small: int = rounding.SMALL,
    rows: torch.Tensor | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``backward`` in float32 with its rounding margin where ``rounding.fast_graph`` allows
    (sound, and faster; ``small``: its size threshold), else in the graph's dtype; the bound
    is in the graph's dtype, the coefficients too with ``cast`` (an intermediate bound does
    not need them). The choice is per sample, by ``rows`` (an int, or (B,)): the rows that
    sample has at this node in all (its unstable neurons twice, its spec rows), whatever
    chunk of them ``a`` carries, by default ``a``'s; never by the batch, so a sample's bound
    does not depend on the samples beside it or on the chunking (#32). A sample whose rows
    float32 does not hold exactly (a VNN-LIB spec's 0.1) stays in the graph's dtype: their
    float32 copy would bound another specification."""
    counts = a.shape[1] if rows is None else rows
    narrow, fast = fast_samples(graph, start, counts, a.shape[0], small)
    if a.dtype != torch.float32 and bool(fast.any()):  # rows float32 holds exactly only
        fast = fast & (a.float().to(a.dtype) == a).flatten(1).all(1)
    if bool(fast.all()) or not bool(fast.any()):
        use = narrow if bool(fast.any()) else None  # one precision for all (or none)
        return _sound_pass(graph, start, a, boxes, mode, slopes, cast, use)
    bound = a.new_empty(a.shape[:2], dtype=graph.dtype)
    coeff = a.new_empty(*a.shape[:2], *graph.input_shape, dtype=graph.dtype)
    for group, use in ((fast, narrow), (~fast, None)):
        at = group.nonzero().flatten()
        part = [(lo[at], hi[at]) for lo, hi in boxes[: start + 1]]
        some = {i: s[at] for i, s in slopes.items()} if slopes is not None else None
        bound[at], coeff[at] = _sound_pass(graph, start, a[at], part, mode, some, cast, use)
    return bound, coeff


def fast_samples(
    graph: BoundGraph, start: int, rows: torch.Tensor | int, batch: int, small: int
) -> tuple[BoundGraph | None, torch.Tensor]:
    """The float32 graph of a pass from node ``start`` and which of ``batch`` samples (B,)
    take it, each by its own ``rows`` (per sample, or one count for all) times the pass's
    widest node (``rounding.fast_samples``)."""
    counts = torch.as_tensor(rows, dtype=torch.int64).expand(batch)
    widest = max(budget.numel(op.out_shape) for op in graph.ops[: start + 1])
    return rounding.fast_samples(graph, counts * widest, small, start)


def _sound_pass(graph, start, a, boxes, mode, slopes, cast, narrow: BoundGraph | None):
    """``sound_backward`` of samples that all take one precision: float32 on ``narrow``
    with its rounding margins, or the graph's dtype where it is None."""
    if narrow is None:
        return backward(graph, start, a.to(graph.dtype), boxes, mode, slopes)
    boxes32 = [rounding.outward_kept(box) for box in boxes[: start + 1]]
    slopes32 = {i: s.float() for i, s in slopes.items()} if slopes is not None else None
    with torch.no_grad():
        bound, coeff = backward(narrow, start, a.float(), boxes32, mode, slopes32, rounded=True)
    return bound, coeff.to(graph.dtype) if cast else coeff


def pass_graph(
    graph: BoundGraph, start: int, rows: int, small: int = rounding.SMALL
) -> BoundGraph | None:
    """The float32 graph ``sound_backward`` runs a sample's ``rows`` rows (per sample, its
    batch not counted) from node ``start`` on, or None for the graph's own dtype
    (``rounding.fast_graph``)."""
    widest = max(budget.numel(op.out_shape) for op in graph.ops[: start + 1])
    return rounding.fast_graph(graph, rows * widest, small, start)


def depends_on_activation(graph: BoundGraph) -> list[bool]:
    flags = [False]
    for op in graph.ops[1:]:
        flags.append(any(flags[i] or graph.ops[i].kind == "activation" for i in op.inputs))
    return flags


@budget.budget_read_once()  # one ledger claim for every layer's passes
def linear_boxes(
    graph: BoundGraph,
    lower: torch.Tensor,
    upper: torch.Tensor,
    mode: str = "adaptive",
    alpha_steps: int = 0,
    searched: dict[int, torch.Tensor] | None = None,
    known: list[Box] | None = None,
) -> list[Box]:
    """IBP boxes with every activation's input tightened by a backward pass (CROWN), with
    ``alpha_steps`` of slope optimisation per layer (alpha-CROWN intermediate bounds).
    ``searched``: per node, the samples (bool, (B,)) it optimises; the others take their box
    from ``known`` (CROWN's, ``search_plan.py``); a node not in it: every sample."""
    boxes = interval_boxes(graph, lower, upper)
    deep = depends_on_activation(graph)
    for _i, op in enumerate(graph.ops):
        if op.kind != "activation" or not deep[op.inputs[0]]:
            continue  # IBP is exact on an affine function of the input (up to its margin)
        j, relu = op.inputs[0], op.relaxation is RELU
        some = None if searched is None else searched.get(j)
        if some is None or bool(some.all()):
            boxes[j] = _tighten(graph, j, boxes, mode, relu, alpha_steps)
        else:
            boxes[j] = _tighten_some(graph, j, boxes, mode, relu, alpha_steps, some, known[j])
        boxes = forward_from(graph, boxes, j)
    return boxes


def _tighten_some(
    graph: BoundGraph,
    j: int,
    boxes: list[Box],
    mode: str,
    relu: bool,
    alpha_steps: int,
    some: torch.Tensor,
    known: Box,
) -> Box:
    """Node ``j``'s box: ``_tighten`` on the samples ``some``, ``known`` on the others."""
    lo, hi = torch.maximum(boxes[j][0], known[0]), torch.minimum(boxes[j][1], known[1])
    index = some.nonzero().flatten()
    if index.numel() > 0:
        part = [(a[index], c[index]) for a, c in boxes]
        lo[index], hi[index] = _tighten(graph, j, part, mode, relu, alpha_steps)
    return lo, hi


def _tighten(
    graph: BoundGraph, j: int, boxes: list[Box], mode: str, relu: bool, alpha_steps: int = 0
) -> Box:
    """Node ``j``'s box tightened by backward passes from its unstable neurons (a ReLU's
    stable ones are exact already), in chunks of neurons sized to the memory budget; a
    convolution's neurons on their receptive fields where ``receptive.py`` can crop them."""
    crops = receptive.crops_for(graph, j) if relu else None
    if crops is not None:
        return _tighten_cropped(crops, j, boxes, mode, alpha_steps)
    return _tighten_dense(graph, j, boxes, mode, relu, alpha_steps)


def _tighten_cropped(
    crops: receptive.Crops, j: int, boxes: list[Box], mode: str, alpha_steps: int
) -> Box:
    """``_tighten`` with one sample per (sample, output position) pair that has an unstable
    neuron, on that position's crop of the chain (``receptive.py``); the pairs go in chunks
    sized to the memory budget (one pair, two rows and its crop's boxes at the least), and
    with a slope search to at most ``budget.SEARCH_CHUNK`` bytes (faster per pair)."""
    lo, hi = boxes[j]
    b, c, h, w = lo.shape
    unstable = ((lo < 0) & (hi > 0)).reshape(b, c, h * w).sum(1)  # (B, places)
    pairs = (unstable > 0).nonzero()  # (N, 2): sample, place
    # an image's passes take the precision of all its pairs in one chunk alone (each pair
    # padded to its most unstable channels at a place): a batch of 1 as before session 15
    rows = 2 * (unstable > 0).sum(1) * unstable.amax(1)
    end = crops.end
    per_pair = budget.crop_pair_bytes(crops.graph, end, alpha_steps > 0)
    fixed, most = budget.box_bytes(crops.graph, 0), budget.search_chunk(alpha_steps)
    step = budget.rows_per_chunk(per_pair, max(1, pairs.shape[0]), fixed, most)
    out = [t.reshape(b, c, h * w).transpose(1, 2).clone() for t in (lo, hi)]  # (B, places, C)
    for first in range(0, pairs.shape[0], step):
        sample, place = pairs[first : first + step].unbind(1)
        positions = torch.stack([place // w, place % w], 1)
        cropped = receptive.crop_boxes(crops, boxes, sample, positions)
        new = _tighten_dense(crops.graph, end, cropped, mode, True, alpha_steps, rows[sample])
        for flat, bound in zip(out, new, strict=True):
            flat[sample, place] = bound.reshape(-1, c)
    return out[0].transpose(1, 2).reshape(lo.shape), out[1].transpose(1, 2).reshape(lo.shape)


def _tighten_dense(
    graph: BoundGraph,
    j: int,
    boxes: list[Box],
    mode: str,
    relu: bool,
    alpha_steps: int = 0,
    rows: torch.Tensor | None = None,
) -> Box:
    """``_tighten`` with one backward pass per neuron over the whole graph. ``rows`` (B,):
    the rows per sample that decide its passes' precision (``sound_backward``), by default
    its own unstable neurons twice; samples of either precision go through apart, so what
    a pass keeps on its boxes (``memo.py``) serves all its chunks."""
    lo, hi = boxes[j]
    b = lo.shape[0]
    flat_lo, flat_hi = lo.reshape(b, -1), hi.reshape(b, -1)
    # each sample's own unstable neurons (stable ones are exact), padded to the batch's most
    wanted = (flat_lo < 0) & (flat_hi > 0) if relu else torch.ones_like(flat_lo, dtype=torch.bool)
    rows = 2 * wanted.sum(1) if rows is None else rows
    start = graph.ops[j].inputs[0] if _from_input(graph, j, alpha_steps) else j
    fast = fast_samples(graph, start, rows, b, rounding.SMALL)[1]
    if bool(fast.any()) and not bool(fast.all()):
        return _tighten_apart(graph, j, boxes, mode, relu, alpha_steps, rows, fast)
    m = int(wanted.sum(1).max())
    if m == 0:
        return lo, hi
    order = torch.argsort(wanted.to(torch.int8), dim=1, descending=True, stable=True)[:, :m]
    per_row = budget.row_bytes(graph, j, b, grad=alpha_steps > 0)
    most = budget.search_chunk(alpha_steps)
    step = max(1, budget.rows_per_chunk(per_row, 2 * m, budget.box_bytes(graph, b), most) // 2)
    new_lo, new_hi = flat_lo.clone(), flat_hi.clone()
    for first in range(0, m, step):
        chunk = order[:, first : first + step]
        bound = _bound_neurons(graph, j, chunk, boxes, mode, alpha_steps, rows)
        valid = wanted.gather(1, chunk)  # False on padding rows (stable neurons)
        old_lo, old_hi = flat_lo.gather(1, chunk), flat_hi.gather(1, chunk)
        c = chunk.shape[1]
        new_lo.scatter_(1, chunk, torch.where(valid, old_lo.maximum(bound[:, :c]), old_lo))
        new_hi.scatter_(1, chunk, torch.where(valid, old_hi.minimum(-bound[:, c:]), old_hi))
    return new_lo.reshape(lo.shape), new_hi.reshape(hi.shape)


def _tighten_apart(graph, j, boxes, mode, relu, alpha_steps, rows, fast) -> Box:
    """``_tighten_dense`` on the samples ``fast`` (B,) and on the others, each apart."""
    lo, hi = boxes[j][0].clone(), boxes[j][1].clone()
    for group in (fast, ~fast):
        at = group.nonzero().flatten()
        part = [(a[at], c[at]) for a, c in boxes]
        lo[at], hi[at] = _tighten_dense(graph, j, part, mode, relu, alpha_steps, rows[at])
    return lo, hi


def _from_input(graph: BoundGraph, j: int, alpha_steps: int) -> bool:
    """Whether node ``j``'s neurons are bounded from its input (``_dense_neurons``)."""
    return alpha_steps == 0 and graph.ops[j].kind == "dense"


def _bound_neurons(
    graph: BoundGraph,
    j: int,
    chunk: torch.Tensor,
    boxes: list[Box],
    mode: str,
    alpha_steps: int,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Lower bounds (B, 2c) of the neurons ``chunk`` (B, c) of node ``j``, then of their
    negations; ``rows`` (B,): each sample's rows at node ``j`` in all (its precision)."""
    if _from_input(graph, j, alpha_steps):
        return _dense_neurons(graph, j, chunk, boxes, mode, rows)
    lo = boxes[j][0]
    b, c = chunk.shape
    eye = lo.new_zeros(b, c, lo[0].numel()).scatter_(2, chunk.unsqueeze(2), 1.0)
    a = torch.cat([eye, -eye], 1).reshape(b, 2 * c, *lo.shape[1:])
    del eye
    if alpha_steps > 0:
        return optimised_backward(graph, j, a, boxes, alpha_steps, 0.1, rows=rows)[0]
    return sound_backward(graph, j, a, boxes, mode, cast=False, rows=rows)[0]


def _dense_neurons(
    graph: BoundGraph,
    j: int,
    chunk: torch.Tensor,
    boxes: list[Box],
    mode: str,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``_bound_neurons`` of a dense layer: a one-hot row through ``W`` is a row of ``W``
    (exactly, in either dtype), so the pass starts at the layer's input with those rows and
    the biases are added after, one matrix product fewer. The float64 sum of bound and bias
    rounds by at most 2^-53 of its size: 2^-52 is subtracted."""
    i = graph.ops[j].inputs[0]
    b, c = chunk.shape
    rows = 2 * c if rows is None else rows
    narrow, fast = fast_samples(graph, i, rows, b, rounding.SMALL)
    op = (narrow if bool(fast.any()) else graph).ops[j]  # no cast of the rows
    both = torch.cat([chunk, chunk], 1)  # one gather of the rows twice, then half negated
    a = op.weight.detach().index_select(0, both.flatten()).reshape(b, 2 * c, -1)
    a[:, c:].neg_()
    a, bias = a.reshape(b, 2 * c, *graph.ops[i].out_shape), op.bias.detach()[chunk]
    bound = sound_backward(graph, i, a, boxes, mode, cast=False, rows=rows)[0]
    total = bound + torch.cat([bias, -bias], 1).to(bound.dtype)
    total = total - total.abs() * 2.0**-52
    if not float32_rounding.active():
        return total
    e = float32_rounding.error(graph.ops[j], [boxes[i]]).flatten(1).gather(1, chunk)
    return float32_rounding.lowered(total, torch.cat([e, e], 1))


def forward_from(graph: BoundGraph, boxes: list[Box], j: int) -> list[Box]:
    """Re-run IBP after node ``j`` (intersecting) so later boxes profit from a tighter one."""
    for i in range(j + 1, len(graph.ops)):
        op = graph.ops[i]
        lo, hi = float32_rounding.interval(op, [boxes[k] for k in op.inputs])
        boxes[i] = torch.maximum(lo, boxes[i][0]), torch.minimum(hi, boxes[i][1])
    return boxes


def ibp_spec_lower(graph: BoundGraph, boxes: list[Box], spec: torch.Tensor) -> torch.Tensor:
    """IBP's bound of ``C f``, folding ``C`` into the last op when it is affine (elision)."""
    out = graph.ops[-1]
    a = spec.reshape(*spec.shape[:2], *out.out_shape)
    if out.kind not in {"dense", "conv", "elementwise", "reshape"}:
        value = concretize(a, boxes[-1])
        if not float64_margin.applies(value):
            return value
        slack = float64_margin.concretise_margin(a, boxes[-1])
        sums = float64_margin.factor(4) * (value.abs() + slack)  # the subtractions round
        return value - slack - sums - float64_margin.TINY * a[0, 0].numel()
    box = boxes[out.inputs[0]]
    (back,), bias = out.backward(a, box)
    value = concretize(back, box) + bias
    if not float64_margin.applies(value):
        return value
    slack = float64_margin.op_slack(out, a.to(value.dtype), [box]) + value.new_zeros(())
    if float32_rounding.active():  # the float32 network's rounding at the folded op
        slack = slack + float32_rounding.slack(out, a.to(value.dtype), [box])
    slack = slack + float64_margin.concretise_margin(back, box)
    sums = float64_margin.factor(4) * (bias.abs() + value.abs() + slack)
    return value - slack - sums - float64_margin.TINY * float64_margin.terms(graph.ops)


def spec_lower(
    graph: BoundGraph,
    boxes: list[Box],
    spec: torch.Tensor,
    mode: str = "adaptive",
    slopes: dict[int, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CROWN's bound of ``C f`` with the given intermediate boxes, and its input coefficients."""
    a = spec.reshape(*spec.shape[:2], *graph.ops[-1].out_shape)
    end = len(graph.ops) - 1
    if slopes is not None:  # one slope per row: the rows go together
        return sound_backward(graph, end, a, boxes, mode, slopes)
    k = a.shape[1]  # a sample's rows in all decide its precision, whatever the chunk
    bound = lambda rows, part: sound_backward(  # noqa: E731
        graph, end, rows, part, mode, small=rounding.FINAL_SMALL, rows=k
    )
    return in_chunks(graph, end, a, boxes, False, bound)


def optimise_slopes(
    graph: BoundGraph,
    boxes: list[Box],
    spec: torch.Tensor,
    steps: int = 20,
    lr: float = 0.1,
    offset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """alpha-CROWN: the best bound of ``C f`` over ``steps`` of Adam on the ReLU lower
    slopes; with the rows' ``offset`` (B, K) it stops early (``optimised_backward``)."""
    a = spec.reshape(*spec.shape[:2], *graph.ops[-1].out_shape)
    end, k = len(graph.ops) - 1, a.shape[1]
    bound = lambda rows, part, shift=None: optimised_backward(  # noqa: E731
        graph, end, rows, part, steps, lr, shift, rows=k
    )
    return in_chunks(graph, end, a, boxes, True, bound, offset)


def in_chunks(
    graph: BoundGraph,
    start: int,
    a: torch.Tensor,
    boxes: list[Box],
    grad: bool,
    bound: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    offset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``bound(rows, boxes)`` of the rows of ``a`` (B, K, ...) in chunks sized to the memory
    budget: a sample's rows in chunks sized as if it were alone, and as many samples at
    once as fit beside the batch's boxes, so a sample's chunks of rows do not depend on its
    batch (#32: alpha-CROWN's early stop is per sample and chunk of its rows). Rows are
    bounded independently (alpha-CROWN's slopes are per row), so otherwise chunking
    changes nothing but the peak. With ``offset`` (B, K), ``bound`` gets each chunk's
    columns too. A sample whose rows do not fit one chunk beside the batch's boxes runs a
    chunk over the budget by at most the other samples' boxes."""
    b, k = a.shape[:2]
    per_row = budget.row_bytes(graph, start, 1, grad)
    step = budget.rows_per_chunk(per_row, k, budget.box_bytes(graph, 1))
    together = budget.rows_per_chunk(step * per_row, b, budget.box_bytes(graph, b))
    samples = []
    for s0 in range(0, b, together):
        at = slice(s0, s0 + together)
        part = boxes if together >= b else [(lo[at], hi[at]) for lo, hi in boxes]
        parts = []
        for first in range(0, k, step):
            cols = slice(first, first + step)
            shift = () if offset is None else (offset[at, cols],)
            parts.append(bound(a[at, cols], part, *shift))
        samples.append(_joined(parts, 1))
    return _joined(samples, 0)


def _joined(parts: list[tuple[torch.Tensor, torch.Tensor]], dim: int):
    """Bounds and coefficients of chunks, concatenated along ``dim``."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts], dim), torch.cat([p[1] for p in parts], dim)


def optimised_backward(
    graph: BoundGraph,
    start: int,
    a: torch.Tensor,
    boxes: list[Box],
    steps: int,
    lr: float,
    offset: torch.Tensor | None = None,
    rows: torch.Tensor | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``backward`` from node ``start`` with one lower slope per row and unstable ReLU,
    optimised by Adam and clamped to [0, 1]; the best bound per row over the steps.

    The search runs in float32 (its convolutions are ~3x faster than float64's on a CPU);
    each row's best slopes are then bounded once more in the graph's own dtype, and that
    bound is the result: any slope in [0, 1] is sound, so the search's precision only
    decides how tight it is. CROWN's bound is kept where it is higher. With the rows'
    ``offset`` (B, K) each sample's search stops early (``slope_stops``): a sample whose
    sound bound then certifies leaves, the others resume it. ``rows``: each sample's rows
    in all, whatever chunk of them ``a`` is (its precision, ``sound_backward``)."""
    rows = a.shape[1] if rows is None else rows
    best, coeff = sound_backward(graph, start, a, boxes, rows=rows)
    best, coeff = best.detach(), coeff.detach()
    for stop in slope_stops(graph, start, a, boxes, steps, lr, offset=offset):
        if not stop.slopes:
            break
        # the due samples only: another sample's bound must not move with its batch's stops
        due = stop.due.nonzero().squeeze(1)
        slopes = {i: alpha[due].to(graph.dtype) for i, alpha in stop.slopes.items()}
        part = [(lo[due], hi[due]) for lo, hi in boxes]
        with torch.no_grad():
            some = rows[due] if torch.is_tensor(rows) else rows
            bound, now = sound_backward(graph, start, a[due], part, slopes=slopes, rows=some)
        better = bound > best[due]  # per row, the highest of CROWN's and every stop's bound
        keep = better.reshape(*better.shape, *([1] * (coeff.dim() - 2)))
        best[due], coeff[due] = (
            torch.where(better, bound, best[due]),
            torch.where(keep, now, coeff[due]),
        )
        if offset is not None:
            stop.certified = torch.zeros_like(stop.due)
            stop.certified[due] = (best[due] + offset[due] > 0).all(1)
    return best, coeff


def search_slopes(
    graph: BoundGraph,
    start: int,
    a: torch.Tensor,
    boxes: list[Box],
    steps: int,
    lr: float,
    decay: float = 1.0,
    init: dict[int, torch.Tensor] | None = None,
) -> dict[int, torch.Tensor]:
    """The best lower slopes per row (B, K, *shape) of every ReLU before ``start`` over
    ``steps`` of Adam (``lr``, times ``decay`` after each step) from ``init`` (CROWN's by
    default), in ``SEARCH_DTYPE``; empty when there is nothing to search. Any slope in
    [0, 1] is sound: the caller bounds the result again by a sound pass."""
    *_, last = slope_stops(graph, start, a, boxes, steps, lr, decay, init)
    return last.slopes  # without an offset it stops only after the last step


def stop_lead(rows: torch.Tensor, shift: torch.Tensor, scale: float | torch.Tensor = 1.0):
    """Per sample, its worst row's lead over the early stop's margin ``scale`` (a number,
    or one per sample) x (``STOP_ABS`` + ``STOP_REL`` x the row's size): the search's bound
    is float32 without rounding margins, so it stops a little above 0 for the sound pass
    to certify."""
    if torch.is_tensor(scale):
        scale = scale.unsqueeze(1)
    margin = scale * (STOP_ABS + STOP_REL * rows.abs())
    return (rows + shift - margin).nan_to_num(-torch.inf).amin(1)


@dataclass
class Stop:
    """A stop of the output search: the ``steps`` run, the best ``slopes`` so far per row
    and the samples ``due`` (B,) whose stop it is. The caller sets ``certified`` (B,) to the
    due samples its sound pass certifies: they leave; the others resume."""

    steps: int
    slopes: dict[int, torch.Tensor]
    due: torch.Tensor
    certified: torch.Tensor | None = None


def slope_stops(
    graph: BoundGraph,
    start: int,
    a: torch.Tensor,
    boxes: list[Box],
    steps: int,
    lr: float,
    decay: float = 1.0,
    init: dict[int, torch.Tensor] | None = None,
    offset: torch.Tensor | None = None,
) -> Iterator[Stop]:
    """``search_slopes``' stops: after the last step (every sample that has not left due)
    and, with the rows' ``offset`` (B, K), whenever a sample's worst row leads its stop
    margin (``stop_lead``; that sample due). Each sample has its own stops and margin,
    doubled after each of its stops, so a sample stops at the same steps alone as in any
    batch (Adam is elementwise and a sample's bound depends on its own slopes only); one
    the caller's sound pass does not certify resumes (same Adam state)."""
    search = graph.in_dtype(SEARCH_DTYPE) if graph.dtype == torch.float64 else graph
    cast = search.dtype
    search_a = a.detach().to(cast)
    search_boxes = [(lo.detach().to(cast), hi.detach().to(cast)) for lo, hi in boxes]
    alphas = start_slopes(search, start, search_boxes, a.shape[1])
    for i, t in (init or {}).items():
        alphas[i] = t.detach().to(cast).clone().requires_grad_(True)
    left = torch.zeros(a.shape[0], dtype=torch.bool)  # samples certified at one of their stops
    if not alphas or steps <= 0:
        yield Stop(0, {}, ~left)
        return
    chosen = {i: alpha.detach().clone() for i, alpha in alphas.items()}
    top = torch.full(a.shape[:2], -torch.inf, dtype=cast)
    optimiser = torch.optim.Adam(list(alphas.values()), lr=lr)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimiser, decay)
    scale = torch.ones(a.shape[0], dtype=cast)  # each sample's stop margin factor
    for step in range(1, steps + 1):
        check_time()
        with torch.enable_grad():
            bound, _ = backward(search, start, search_a, search_boxes, slopes=alphas)
            optimiser.zero_grad()
            (-bound.sum()).backward()
        better = bound.detach() > top
        top = torch.where(better, bound.detach(), top)
        for i, alpha in alphas.items():
            keep = better.reshape(*better.shape, *([1] * (alpha.dim() - 2)))
            chosen[i] = torch.where(keep, alpha.detach(), chosen[i])
        if step == steps:
            yield Stop(step, chosen, ~left)
        elif offset is not None:
            due = ~left & (stop_lead(top, offset.to(cast), scale) > 0)
            if bool(due.any()):
                stop = Stop(step, chosen, due)
                yield stop  # the caller's sound pass decides; resumed if it does not certify
                told = torch.zeros_like(due) if stop.certified is None else stop.certified
                certified = due & told
                left = left | certified
                scale = torch.where(due & ~certified, 2 * scale, scale)
                if bool(left.all()):
                    return
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            for alpha in alphas.values():
                alpha.clamp_(0, 1)


def start_slopes(
    graph: BoundGraph, start: int, boxes: list[Box], rows: int
) -> dict[int, torch.Tensor]:
    """CROWN's adaptive lower slope of every ReLU before ``start``, one copy per row; a
    sigmoid's or tanh's two slopes (``SShapeRelaxation.initial_alpha``, (B, K, 2, ...)):
    where alpha-CROWN's search starts, here and in ``joint_alpha``."""
    alphas = {}
    for i, op in enumerate(graph.ops[:start]):
        if op.kind == "activation" and op.relaxation is RELU:
            lo, hi = boxes[op.inputs[0]]
            init = relu_default_slope(lo, hi, "adaptive").unsqueeze(1)
            alphas[i] = init.expand(-1, rows, *lo.shape[1:]).clone().requires_grad_(True)
        elif op.kind == "activation" and isinstance(op.relaxation, SShapeRelaxation):
            init = op.relaxation.initial_alpha(*boxes[op.inputs[0]]).unsqueeze(1)
            alphas[i] = init.expand(-1, rows, *init.shape[2:]).clone().requires_grad_(True)
    return alphas
