"""Joint alpha-CROWN: every layer's slopes optimised together for the final bound.

Xu et al. (2021) and auto_LiRPA's ``CROWN-Optimized`` optimise the slopes of every
intermediate bound for the *output's* bound: each Adam step recomputes every activation
input's box by CROWN with the current slopes (one slope set per bounded layer, row and
relaxed neuron), then bounds the spec rows on those boxes; the loss is minus the sum of the
spec rows' bounds, so its gradient flows through the intermediate boxes. The layerwise
search (``bounds.linear_boxes``) instead tightens each box for its own sake with the earlier
boxes fixed; on eran's sigmoid net it ends far lower (docs/certification.md).

Soundness: the search runs in float32 without rounding margins (its ReLU chord intercept
and sigmoid/tanh intercepts are only cast, so they carry gradients). Its result is never
reported: the slopes of each sample's best step are clamped to [0, 1] and bounded again by
``sound_backward`` (exact outward-rounded intercepts and the passes' rounding margins),
layer by layer, each box intersected with CROWN's; every slope in [0, 1] is sound, so
that pass is a sound bound whatever Adam produced. So is the early stop: it only decides
when that re-bound runs, and a re-bound that does not certify resumes the search, on the
samples it left open only (``search``'s ``send``): each sample's result is still one of
its own sound re-bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from aisafety.verification import bounds as b
from aisafety.verification import budget
from aisafety.verification.deadline import check_time
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.relaxations import RELU, SShapeRelaxation

Slopes = dict[int, dict[int, torch.Tensor]]  # bounded node -> activation node -> slopes
DECAY = 0.98  # the learning rate's factor per step (auto_LiRPA's default)
Bound = Callable[[int, torch.Tensor, list[Box], dict[int, torch.Tensor]], torch.Tensor]
ABS_MARGIN, REL_MARGIN = b.STOP_ABS, b.STOP_REL  # the early stop's margin (``_lead``)
# a sample whose best lead gained at most STALL_GAIN over the last STALL_STEPS steps, and
# whose last step's lead is within STALL_GAIN of those steps' lowest, has stalled and leaves
# the search (``_stalled``); docs/certification.md ("Stalled samples leave") has the
# measurements that chose them
STALL_STEPS, STALL_GAIN = 10, 3e-3


@dataclass
class Best:
    """The search's slopes: per sample those of the step whose worst spec row led most
    (every layer's, so the boxes and rows stay one step's), per spec row (``rows``) the
    spec rows' slopes of that row's best step; ``steps`` run so far; ``samples``: the
    batch's samples these slopes are for (None: all), once certified ones left the search."""

    slopes: Slopes
    rows: dict[int, torch.Tensor] | None = None
    steps: int = 0
    samples: torch.Tensor | None = None


@dataclass
class Target:
    """An activation's input node and, per sample, the neurons a pass bounds: a ReLU's
    unstable ones (padded to the batch's most; ``valid`` False on padding), every neuron
    of a sigmoid or tanh."""

    node: int
    chunk: torch.Tensor  # (B, m) flat neuron indices
    valid: torch.Tensor  # (B, m)

    def rows(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The rows (B, 2m, *shape): each neuron, then its negation."""
        b, m = self.chunk.shape
        eye = torch.zeros(b, m, budget.numel(shape), dtype=dtype)
        eye.scatter_(2, self.chunk.unsqueeze(2), 1.0)
        return torch.cat([eye, -eye], 1).reshape(b, 2 * m, *shape)

    def take(self, samples: torch.Tensor) -> Target:
        """The target on ``samples`` (indices) of the batch only."""
        return Target(self.node, self.chunk[samples], self.valid[samples])


def targets(graph: BoundGraph, boxes: list[Box]) -> list[Target]:
    """The activation inputs CROWN bounds (``linear_boxes``' nodes), in graph order."""
    deep, found = b.depends_on_activation(graph), []
    for op in graph.ops:
        j = op.inputs[0] if op.kind == "activation" else None
        if j is None or not deep[j] or any(t.node == j for t in found):
            continue
        lo, hi = (t.reshape(t.shape[0], -1) for t in boxes[j])
        relu = op.relaxation is RELU
        wanted = (lo < 0) & (hi > 0) if relu else torch.ones_like(lo, dtype=torch.bool)
        m = int(wanted.sum(1).max())
        if m > 0:
            order = torch.argsort(wanted.to(torch.int8), dim=1, descending=True, stable=True)
            chunk = order[:, :m]
            found.append(Target(j, chunk, wanted.gather(1, chunk)))
    return found


# bytes a search step keeps per coefficient element (a row's value at one neuron) of each
# op a pass crosses, until the step's gradient (bench/joint_bytes.py, docs/memory.md): a
# sigmoid's or tanh's lines with per-row slopes, float64 arithmetic that autograd keeps
# (``budget.SSHAPE_SAVED``), and its slopes' state; a ReLU's float32 products and its
# slope's state; any other op two float32 values (its weights do not require grad:
# ``build_graph``, ``BoundGraph.in_dtype``, so an affine op keeps no coefficients)
RELU_SAVED = 4 * (budget.SAVED + budget.SLOPE_STATE)
SSHAPE_SAVED = RELU_SAVED + 4 * budget.SSHAPE_SAVED
OTHER_SAVED = 8


def joint_bytes(graph: BoundGraph, batch: int, found: list[Target], rows: int) -> int:
    """Peak bytes of one search step (the sum of ``joint_parts``)."""
    return sum(joint_parts(graph, batch, found, rows).values())


def most_joint_bytes(graph: BoundGraph, batch: int, rows: int) -> int:
    """``joint_bytes`` before CROWN's boxes say which ReLUs are unstable: every neuron of
    every bounded activation input counted, so at least what ``joint_alpha`` checks on any
    ``batch`` samples (a sigmoid's or tanh's are all bounded anyway): what a verifier sizes
    its batches by before any work."""
    deep, widths = b.depends_on_activation(graph), {}
    for op in graph.ops:
        if op.kind == "activation" and deep[op.inputs[0]]:
            widths[op.inputs[0]] = budget.numel(graph.ops[op.inputs[0]].out_shape)
    return sum(_step_parts(graph, batch, list(widths.items()), rows).values())


def joint_parts(graph: BoundGraph, batch: int, found: list[Target], rows: int) -> dict[str, int]:
    """One search step's peak in parts (``_step_parts``) for the neurons of ``found``."""
    return _step_parts(graph, batch, [(t.node, t.chunk.shape[1]) for t in found], rows)


def _step_parts(
    graph: BoundGraph, batch: int, widths: list[tuple[int, int]], rows: int
) -> dict[str, int]:
    """One search step's peak in parts, bounding ``widths`` (node, neurons per sample): the
    boxes; what every pass keeps until the step's gradient (autograd state and slopes,
    ``_kept_bytes`` per row); one pass's temporaries (``budget.row_bytes`` in the search's
    dtype: the passes run one at a time)."""
    passes = [(node, 2 * m) for node, m in widths] + [(len(graph.ops) - 1, rows)]
    search = b.SEARCH_DTYPE if graph.dtype == torch.float64 else graph.dtype
    scale = search.itemsize / graph.dtype.itemsize
    temporaries = max(r * budget.row_bytes(graph, start, batch) for start, r in passes)
    return {
        "boxes": 3 * budget.box_bytes(graph, batch),
        "kept": batch * sum(r * _kept_bytes(graph, start) for start, r in passes),
        "temporaries": int(scale * temporaries),
    }


def _kept_bytes(graph: BoundGraph, start: int) -> int:
    """What one row of a search pass from node ``start`` keeps until the gradient."""
    total = 0
    for op in graph.ops[: start + 1]:
        per = OTHER_SAVED
        if op.kind == "activation":
            per = SSHAPE_SAVED if budget.is_sshape(op) else RELU_SAVED
        total += per * budget.numel(op.out_shape)
    return total


def joint_alpha(
    graph: BoundGraph,
    crown: list[Box],
    spec: torch.Tensor,
    steps: int,
    lr: float,
    sshape_lr: float,
    offset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[Box]] | None:
    """The sound bound (B, K), its input coefficients and the boxes of the best step of
    ``steps`` of joint Adam from CROWN's boxes ``crown`` (learning rate ``lr`` for ReLU
    slopes, ``sshape_lr`` for sigmoid/tanh slope positions); None when one step would not
    fit the memory budget (the caller falls back to the layerwise search). With the spec
    rows' ``offset`` (B, K) the search stops early once every sample's rows lead their stop
    margin (``search``); a re-bound that then does not certify every sample resumes it."""
    found = targets(graph, crown)
    if joint_bytes(graph, spec.shape[0], found, spec.shape[1]) > budget.current_budget():
        return None
    kept, stops = None, search(graph, found, crown, spec, steps, (lr, sshape_lr), offset)
    best = next(stops)
    while True:
        at = torch.arange(spec.shape[0]) if best.samples is None else best.samples
        sliced = [t.take(at) for t in found], _take_boxes(crown, at), spec[at]
        now = rebound(graph, *sliced, best)
        if kept is None and len(at) < spec.shape[0]:
            kept = _unbounded(now, spec.shape[0], crown)
        kept = now if kept is None else _merged(kept, now, at)
        if best.steps >= steps or offset is None:
            break
        still = (kept[0][at] + offset[at] <= 0).any(1)  # the stop's samples left open
        try:  # certified samples leave the search
            best = stops.send(still)
        except StopIteration:
            break
    return kept


def _unbounded(
    now: tuple[torch.Tensor, torch.Tensor, list[Box]], batch: int, crown: list[Box]
) -> tuple[torch.Tensor, torch.Tensor, list[Box]]:
    """What ``_merged`` takes from a sample no stop has re-bounded yet: a bound of -inf
    and boxes of every value, so a sample's first re-bound is kept as it is."""
    bound = now[0].new_full((batch, *now[0].shape[1:]), -torch.inf)
    coeff = now[1].new_zeros((batch, *now[1].shape[1:]))
    boxes = [(torch.full_like(lo, -torch.inf), torch.full_like(hi, torch.inf)) for lo, hi in crown]
    return bound, coeff, boxes


def _take_boxes(boxes: list[Box], samples: torch.Tensor) -> list[Box]:
    """Every box on ``samples`` (indices) of the batch only."""
    return [(lo[samples], hi[samples]) for lo, hi in boxes]


def _merged(
    kept: tuple[torch.Tensor, torch.Tensor, list[Box]],
    now: tuple[torch.Tensor, torch.Tensor, list[Box]],
    samples: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, list[Box]]:
    """``kept`` (the whole batch) with ``_higher`` of it and ``now`` (the re-bound of
    ``samples`` only) on those samples; the other samples keep theirs."""
    part = _higher((kept[0][samples], kept[1][samples], _take_boxes(kept[2], samples)), now)
    bound, coeff = kept[0].clone(), kept[1].clone()
    bound[samples], coeff[samples] = part[0], part[1]
    boxes = []
    for (lo, hi), (part_lo, part_hi) in zip(kept[2], part[2], strict=True):
        lo, hi = lo.clone(), hi.clone()
        lo[samples], hi[samples] = part_lo, part_hi
        boxes.append((lo, hi))
    return bound, coeff, boxes


def _higher(
    kept: tuple[torch.Tensor, torch.Tensor, list[Box]],
    now: tuple[torch.Tensor, torch.Tensor, list[Box]],
) -> tuple[torch.Tensor, torch.Tensor, list[Box]]:
    """Per row the higher of two sound re-bounds (with its coefficients), and each box
    the intersection of both (each holds every reachable value): a later stop's best
    slopes lead by the search's unrounded bound, so their re-bound may still be lower on
    a row an earlier stop's re-bound had certified."""
    higher = now[0] > kept[0]
    wide = higher.reshape(*higher.shape, *([1] * (kept[1].dim() - 2)))
    boxes = [(torch.maximum(a_lo, b_lo), torch.minimum(a_hi, b_hi))
             for (a_lo, a_hi), (b_lo, b_hi) in zip(kept[2], now[2], strict=True)]  # fmt: skip
    return torch.where(higher, now[0], kept[0]), torch.where(wide, now[1], kept[1]), boxes


def rebound(
    graph: BoundGraph, found: list[Target], crown: list[Box], spec: torch.Tensor, best: Best
) -> tuple[torch.Tensor, torch.Tensor, list[Box]]:
    """``sound_backward`` on ``best``'s slopes clamped to [0, 1]: the boxes with the
    samples' slopes, then the spec rows with the samples' and with the rows' own best
    slopes, the higher per row (both sound). Each sample's precision follows its own
    unstable neurons, not the batch's padding (``bounds.sound_backward``)."""
    counts = {t.node: 2 * t.valid.sum(1) for t in found}  # a sample's own rows, not padding
    sound = lambda node, a, boxes, slopes: b.sound_backward(  # noqa: E731
        graph, node, a, boxes, slopes=slopes, cast=False, rows=counts[node]
    )[0]
    clamp = lambda d: {i: s.clamp(0, 1).to(graph.dtype) for i, s in d.items()}  # noqa: E731
    slopes = {n: clamp(d) for n, d in best.slopes.items()}
    end = len(graph.ops) - 1
    with torch.no_grad():
        boxes = passes(graph, found, list(crown), crown, slopes, sound, graph.dtype)
        a = spec.reshape(*spec.shape[:2], *graph.ops[-1].out_shape).to(graph.dtype)
        bound, coeff = b.sound_backward(graph, end, a, boxes, slopes=slopes[-1])
        if best.rows is not None:
            rows, row_coeff = b.sound_backward(graph, end, a, boxes, slopes=clamp(best.rows))
            higher = rows > bound
            bound = torch.where(higher, rows, bound)
            wide = higher.reshape(*higher.shape, *([1] * (coeff.dim() - 2)))
            coeff = torch.where(wide, row_coeff, coeff)
    return bound, coeff, boxes


def passes(
    graph: BoundGraph,
    found: list[Target],
    boxes: list[Box],
    guards: list[Box],
    slopes: Slopes,
    bound: Bound,
    dtype: torch.dtype,
) -> list[Box]:
    """Every target's box bounded in graph order with its own slopes, its bounded neurons
    intersected with ``guards`` (sound when both are), IBP re-run after it (intersected)."""
    for t in found:
        shape = graph.ops[t.node].out_shape
        low = bound(t.node, t.rows(shape, dtype), boxes, slopes[t.node])
        boxes[t.node] = _narrowed(boxes[t.node], t, low, guards[t.node])
        boxes = b.forward_from(graph, boxes, t.node)
    return boxes


def _narrowed(box: Box, t: Target, low: torch.Tensor, guard: Box) -> Box:
    """``box`` with the bounds ``low`` (B, 2m: neurons, then negations) of ``t``'s valid
    neurons, intersected with ``guard`` (no in-place op: the search differentiates this).
    The sound pass guards with CROWN's boxes; the search with IBP's, not CROWN's: a box
    kept from CROWN would pass no gradient to the slopes that made it, and IBP's keeps a
    diverging step's boxes finite."""
    lo, hi = box
    flat_lo, flat_hi = lo.reshape(lo.shape[0], -1), hi.reshape(hi.shape[0], -1)
    m = t.chunk.shape[1]
    old_lo, old_hi = flat_lo.gather(1, t.chunk), flat_hi.gather(1, t.chunk)
    floor = guard[0].reshape(lo.shape[0], -1).gather(1, t.chunk).to(lo.dtype)
    ceiling = guard[1].reshape(hi.shape[0], -1).gather(1, t.chunk).to(hi.dtype)
    new_lo = torch.maximum(floor, low[:, :m].to(lo.dtype))
    new_hi = torch.minimum(ceiling, -low[:, m:].to(hi.dtype))
    new_lo, new_hi = torch.where(t.valid, new_lo, old_lo), torch.where(t.valid, new_hi, old_hi)
    return (flat_lo.scatter(1, t.chunk, new_lo).reshape(lo.shape),
            flat_hi.scatter(1, t.chunk, new_hi).reshape(hi.shape))  # fmt: skip


def search(
    graph: BoundGraph,
    found: list[Target],
    crown: list[Box],
    spec: torch.Tensor,
    steps: int,
    lrs: tuple[float, float],
    offset: torch.Tensor | None = None,
    decay: float = DECAY,
) -> Iterator[Best]:
    """Up to ``steps`` of Adam in ``bounds.SEARCH_DTYPE`` (``lrs``: ReLU's, sigmoid's and
    tanh's, times ``decay`` per step), slopes clamped to [0, 1] after each; yields the best
    slopes so far (``Best``) after the last step (every sample still searched) and, with
    ``offset``, of the samples due a stop: those whose best step leads their own stop
    margin (``_lead``; each such stop doubles that sample's margin, so a re-bound that does
    not certify resumes its search for a higher bound) or that stalled (``_stalled``:
    neither its best step nor its search climbs). Each sample stops at the same steps
    alone as in any batch. Sent a mask over the yielded ``Best.samples`` (the caller's
    re-bound left those open), it goes on without the others and the stalled ones
    (``_narrowed_adam``: slopes, gradients and Adam's moments sliced, so their steps are
    those the whole batch would take)."""
    search_graph = graph.in_dtype(b.SEARCH_DTYPE) if graph.dtype == torch.float64 else graph
    cast = search_graph.dtype
    start = [(lo.detach().to(cast), hi.detach().to(cast)) for lo, hi in crown]
    with torch.no_grad():
        ibp = b.interval_boxes(search_graph, crown[0][0].to(cast), crown[0][1].to(cast))
    end = len(graph.ops) - 1
    a = spec.detach().to(cast).reshape(*spec.shape[:2], *graph.ops[-1].out_shape)
    shift = torch.zeros(spec.shape[:2], dtype=cast) if offset is None else offset.to(cast)
    alphas = initial_slopes(search_graph, found, start, spec.shape[1])
    best = Best({n: {i: s.detach().clone() for i, s in d.items()} for n, d in alphas.items()})
    groups = [[s for d in alphas.values() for i, s in d.items()
               if (graph.ops[i].relaxation is RELU) == relu] for relu in (True, False)]  # fmt: skip
    params = groups[0] + groups[1]
    if not params or steps <= 0:
        yield best
        return
    best.rows = {i: s.detach().clone() for i, s in alphas[-1].items()}
    top = torch.full(spec.shape[:2], -torch.inf, dtype=cast)  # the best step's rows
    row_top = top.clone()  # each row's best
    optimiser = torch.optim.Adam(
        [{"params": g, "lr": lr} for g, lr in zip(groups, lrs, strict=True) if g]
    )
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimiser, decay)
    pass_bound = lambda node, rows, boxes, slopes: b.backward(  # noqa: E731
        search_graph, node, rows, boxes, slopes=slopes
    )[0]
    scale = torch.ones(spec.shape[0], dtype=cast)  # each sample's stop margin factor
    alive = torch.arange(spec.shape[0])  # the batch's samples still searched
    history = torch.empty(0, spec.shape[0], dtype=cast)  # best leads of the last steps
    trail = history.clone()  # the last steps' own leads
    for step in range(1, steps + 1):
        check_time()
        with torch.enable_grad():
            boxes = passes(search_graph, found, list(start), ibp, alphas, pass_bound, cast)
            bound = pass_bound(end, a, boxes, alphas[-1])
            # the slopes' gradients only: a float32 graph's weights may require grad too
            grads = torch.autograd.grad(-bound.sum(), params, allow_unused=True)
        for s, g in zip(params, grads, strict=True):  # a NaN (0/0 in a line's closed
            # form on a degenerate interval) would poison Adam's moments for good
            s.grad = torch.zeros_like(s) if g is None else g.nan_to_num(0.0, 0.0, 0.0)
        rows = bound.detach()
        better = _lead(rows, shift, 1.0) > _lead(top, shift, 1.0)
        top = torch.where(better.unsqueeze(1), rows, top)
        _keep(best.slopes, alphas, better)
        row_better = rows > row_top
        row_top = torch.where(row_better, rows, row_top)
        history = torch.cat([history, _lead(top, shift, 1.0).unsqueeze(0)])[-STALL_STEPS - 1 :]
        trail = torch.cat([trail, _lead(rows, shift, 1.0).unsqueeze(0)])[-STALL_STEPS - 1 :]
        stalled = _stalled(history, trail)
        _keep({-1: best.rows}, {-1: alphas[-1]}, row_better)
        best.steps = step
        if step == steps:
            yield best
            return
        leading = _lead(top, shift, scale) > 0
        due = stalled | leading
        if offset is not None and bool(due.any()):
            pick = due.nonzero().squeeze(1)
            still = yield _picked(best, pick, alive)  # the due samples' sound re-bound
            # decides: those it leaves open (``still``, when sent) resume, less those that
            # stalled: they leave with that re-bound. Only a sample's stop by its lead
            # doubles its margin (a stall's would delay its stop while it climbs)
            stays = torch.ones_like(due)
            if still is not None:
                stays[pick] = still & ~stalled[pick]
            scale = torch.where(leading & ~stalled & stays, 2 * scale, scale)
            if not bool(stays.any()):
                return
            if not bool(stays.all()):
                keep = stays.nonzero().squeeze(1)
                history, trail = history[:, keep], trail[:, keep]
                alive, found = alive[keep], [t.take(keep) for t in found]
                start, ibp = _take_boxes(start, keep), _take_boxes(ibp, keep)
                a, shift, top, row_top = a[keep], shift[keep], top[keep], row_top[keep]
                scale = scale[keep]
                new = _narrowed_adam(optimiser, keep)
                alphas = {n: {i: new[id(s)] for i, s in d.items()} for n, d in alphas.items()}
                params = [new[id(s)] for s in params]
                slopes = {n: {i: s[keep] for i, s in d.items()} for n, d in best.slopes.items()}
                rows_kept = {i: s[keep] for i, s in best.rows.items()}
                best = Best(slopes, rows_kept, step, alive)
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            for s in params:
                s.nan_to_num_(0.5).clamp_(0, 1)


def _picked(best: Best, pick: torch.Tensor, alive: torch.Tensor) -> Best:
    """``best`` on the searched samples ``pick`` (positions among ``alive``, the batch's
    samples still searched) only: what a stop of those samples re-bounds."""
    slopes = {n: {i: s[pick] for i, s in d.items()} for n, d in best.slopes.items()}
    rows = None if best.rows is None else {i: s[pick] for i, s in best.rows.items()}
    return Best(slopes, rows, best.steps, alive[pick])


def _narrowed_adam(optimiser: torch.optim.Adam, keep: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every parameter of ``optimiser`` replaced by its samples ``keep`` (the batch
    dimension, first), with its gradient and Adam's moments sliced alike (the step count
    and learning rate stay): Adam is elementwise and every sample's bound depends on its
    own slopes only, so the kept samples step on exactly as in the whole batch. Returns
    the new parameter of each old one, by ``id``."""
    new = {}
    for group in optimiser.param_groups:
        for k, old in enumerate(group["params"]):
            fresh = old.detach()[keep].clone().requires_grad_(True)
            fresh.grad = None if old.grad is None else old.grad[keep].clone()
            state = optimiser.state.pop(old, {})
            optimiser.state[fresh] = {
                key: v[keep].clone() if torch.is_tensor(v) and v.dim() > 0 else v
                for key, v in state.items()
            }
            group["params"][k] = new[id(old)] = fresh
    return new


def _stalled(best: torch.Tensor, leads: torch.Tensor) -> torch.Tensor:
    """Per sample, whether it has stalled: its best lead (``best``: the last steps', oldest
    first) gained at most ``STALL_GAIN`` over ``STALL_STEPS`` steps, and its search is not
    climbing back to it either: the last step's own lead (``leads``: each step's) is within
    ``STALL_GAIN`` of the window's lowest. More steps would then cost the batch and hardly
    move its bound (the learning rate decays too). The second test is eran sigmoid 6623's
    case: Adam's first step dropped its lead from -62 to -121, the next ten climbed back
    (+3 to +6 a step) without passing the first step's, so its best was flat and it left
    at step 11 with CROWN's slopes (-56.6) instead of -11.5 after 75 steps
    (docs/certification.md). Not a projection that the sample cannot certify: that left
    15-step bounds below layerwise ones, and a ``complete`` root's bound matters even where
    it does not certify."""
    if best.shape[0] <= STALL_STEPS:
        return torch.zeros(best.shape[1], dtype=torch.bool)
    flat = best[-1] - best[0] <= STALL_GAIN
    return flat & (leads[-1] - leads.amin(0) <= STALL_GAIN)


def _lead(rows: torch.Tensor, shift: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """Per sample, its worst spec row's lead over the stop margin ``scale`` (a number, or
    one per sample) x (``ABS_MARGIN`` + ``REL_MARGIN`` x the row's size): the search's bound
    is float32 without rounding margins, above the sound re-bound by ~0.01 on eran sigmoid
    1211 (+0.22 vs +0.21)."""
    if torch.is_tensor(scale):
        scale = scale.unsqueeze(1)
    margin = scale * (ABS_MARGIN + REL_MARGIN * rows.abs())
    return (rows + shift - margin).nan_to_num(-torch.inf).amin(1)


def _keep(chosen: Slopes, alphas: Slopes, better: torch.Tensor) -> None:
    """``alphas`` into ``chosen`` where ``better`` (B: per sample, or B, K: per row)."""
    for n, d in alphas.items():
        for i, s in d.items():
            keep = better.reshape(*better.shape, *([1] * (s.dim() - better.dim())))
            chosen[n][i] = torch.where(keep, s.detach(), chosen[n][i])


def initial_slopes(graph: BoundGraph, found: list[Target], boxes: list[Box], rows: int) -> Slopes:
    """CROWN's slopes on CROWN's boxes for every pass, one copy per row: a ReLU's adaptive
    lower slope, a sigmoid's or tanh's two CROWN slopes (``tangent_slopes``) as positions
    in ``slope_range``, so the first step is CROWN's bound."""
    slopes: Slopes = {}
    for node, count in [(t.node, 2 * t.chunk.shape[1]) for t in found] + [(-1, rows)]:
        start = len(graph.ops) - 1 if node == -1 else node
        slopes[node] = b.start_slopes(graph, start, boxes, count)
        for i, s in slopes[node].items():
            relaxation = graph.ops[i].relaxation
            if isinstance(relaxation, SShapeRelaxation):
                at = crown_positions(relaxation, *boxes[graph.ops[i].inputs[0]]).unsqueeze(1)
                s.data.copy_(at.expand_as(s))
    return slopes


def crown_positions(relaxation: SShapeRelaxation, lo: torch.Tensor, hi: torch.Tensor):
    """CROWN's lower and upper slopes as positions in ``slope_range`` (B, 2, ...)."""
    lo64, hi64 = lo.double(), hi.double()
    least, most = relaxation.slope_range(lo64, hi64)
    span = torch.where(most - least > 0, most - least, 1.0)
    down, up = relaxation.tangent_slopes(lo64, hi64)
    at = torch.stack([(down - least) / span, (up - least) / span], 1)
    return at.clamp(0, 1).to(lo.dtype)
