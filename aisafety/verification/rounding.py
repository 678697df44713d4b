"""Float32 backward passes kept sound by a rigorous bound on their rounding error.

CROWN's time is its backward passes: products of the (B, K, n) coefficients with every
layer, about twice as fast in float32 as in float64 on a CPU (and float64 convolutions take
a slow path). A float32 pass rounds, so without care its bound could exceed the exact bound
of the same relaxation. Each step of a pass computes sums of at most ``n`` products, and a
computed sum differs from the exact one by at most ``gamma(n) = n u / (1 - n u)`` times the
sum of the absolute products (Higham, *Accuracy and Stability of Numerical Algorithms*,
2nd ed., eq. 3.5: any summation order, blocked or with FMA), u = 2^-24. So when an op maps
the coefficients ``A`` of its output to ``A'`` on its inputs and a constant ``s``, the exact
``A z_out`` and the computed ``A' z_in + s`` differ by at most ``gamma(n) <|A|, v>``, where
``v = |op|(|z_in|) + |constants|`` per sample and ``|z_in|`` is bounded by the (sound) box
of the op's input. Those margins, one dot product per op and row, are subtracted from the
bound; docs/certification.md gives the whole argument. The pass is used only where the
float32 copy of the graph is exact (float32 weights, the usual case) and every activation a
ReLU, whose float32 chord is re-checked in ``relaxations.py``; the boxes stay float64.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

from aisafety.scoped import scoped
from aisafety.verification import memo
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ibp_rounding import U32, U64, gamma
from aisafety.verification.ops import Box, Op
from aisafety.verification.relaxations import round_up

# covers every underflow (at most 2^-126 per product with flush-to-zero, 1e9 products)
TINY = 1e-20
# positive-linear: permutations only (``_bounded``)
FAST_KINDS = {"input", "dense", "conv", "elementwise", "reshape", "add", "activation", "maxpool",
              "positive-linear", "window"}  # fmt: skip

# below this many coefficient elements a pass is cheap in float64, where it is tighter
SMALL = 1 << 16
# the same for the final pass (the spec's few rows): its float32 margin is not worth the
# little it saves beside the intermediate passes (bench/margin_sources.py, docs/certification.md)
FINAL_SMALL = 1 << 22
_MODE: ContextVar[str] = ContextVar("bound_pass_precision", default="auto")


def pass_precision(mode: str) -> AbstractContextManager[str]:
    """Backward passes inside this block run in ``"float64"`` (the exact relaxation, for
    comparisons and the bench), in ``"float32"`` wherever sound (tests), or ``"auto"``."""
    return scoped(_MODE, mode)


def fast_graph(
    graph: BoundGraph, elements: int, small: int = SMALL, start: int | None = None
) -> BoundGraph | None:
    """The float32 copy of a float64 ``graph`` when a pass of ``elements`` coefficients is
    worth running there (at least ``small``) and can soundly: ReLU activations, ops this
    module bounds, and weights that float32 holds exactly. ``start``: the pass begins at
    that node, so only the ops up to it need a bounded rounding (an average pooling after
    it, which has none, does not send an intermediate pass before it to float64)."""
    mode = _MODE.get()
    if mode == "float64" or (mode == "auto" and elements < small):
        return None
    if graph.dtype != torch.float64 or not graph.relu_only:
        return None
    if not all(_bounded(op) for op in graph.ops[: None if start is None else start + 1]):
        return None
    copy = graph.in_dtype(torch.float32)
    if not hasattr(copy, "exact"):
        copy.exact = all(
            a.kind == "elementwise" or _same(a, b)  # elementwise: ``_weighted`` covers it
            for a, b in zip(graph.ops, copy.ops, strict=True)
        )
        copy.wide = graph
    return copy if copy.exact else None


def fast_samples(
    graph: BoundGraph, elements: torch.Tensor, small: int = SMALL, start: int | None = None
) -> tuple[BoundGraph | None, torch.Tensor]:
    """``fast_graph`` per sample: the float32 copy (None where the graph has none) and which
    samples (B,) take it, each by its own pass size ``elements`` (B,), never the batch's."""
    copy = fast_graph(graph, small, small, start)  # the graph's conditions, not the size
    if copy is None:
        return None, torch.zeros(elements.shape, dtype=torch.bool)
    if _MODE.get() == "auto":
        return copy, elements >= small
    return copy, torch.ones(elements.shape, dtype=torch.bool)


def _bounded(op: Op) -> bool:
    """Whether ``exact_shift`` bounds the op's rounding (a positive-linear op: when it only
    moves values, a transpose)."""
    return op.kind in FAST_KINDS and (op.kind != "positive-linear" or op.permutation)


def _same(wide: Op, narrow: Op) -> bool:
    for key, value in vars(wide).items():
        floating = isinstance(value, torch.Tensor) and value.is_floating_point()
        if floating and not torch.equal(getattr(narrow, key).double(), value):
            return False
    return True


def outward(box: Box) -> Box:
    """A float32 box containing the float64 ``box``."""
    lo, hi = box
    down = -round_up(-lo)
    return down, round_up(hi)


def outward_kept(box: Box) -> Box:
    """``outward(box)``, kept on the box while it is unchanged (``memo.py``): the same float32
    box objects in every pass, so what ``exact_shift`` derives from them is kept too."""
    return memo.on_tensor(box[0], "_outward", (box[1],), lambda: outward(box))


def magnitude(box: Box) -> torch.Tensor:
    """max |z| over the box, float64."""
    return torch.maximum(box[0].abs(), box[1].abs()).double()


def unstable_magnitude(box: Box) -> torch.Tensor:
    """max |z| over a ReLU input's box where the neuron is unstable, else 0 (float64): a
    stable neuron's slopes are 0 or 1 (``relaxations.py``), whose products are exact, so
    only an unstable neuron's coefficient rounds (its chord slope, or an alpha slope)."""
    lo, hi = box
    return torch.where((lo < 0) & (hi > 0), magnitude(box), 0.0)


CHUNK = 1 << 18  # elements of a row chunk cast to float64 at once (2 MiB: few calls, in cache)
# a sample's rows below this many elements go through ``bmm`` over chunks of samples; at or
# above it one product per sample is faster (bench in docs/certification.md)
BATCHED_ROWS = 1 << 14


def dots(
    a: torch.Tensor, signed: torch.Tensor, absolute: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``<a, signed[..., m]>`` and ``<|a|, absolute[..., m]>`` per row (B, K, m), in float64
    (float32 products are exact there) with ``signed`` and ``absolute`` per sample (B, n, m)
    float64; the rows go through in cache-sized chunks so the float64 copy stays small.
    A sample's rows that are small (one row: branch and bound's domains; a few short ones:
    cropped passes' thousands of (image, position) samples) go through as one batched
    product per chunk of samples, not a Python loop over samples. The path and the chunk
    depend only on a sample's row shape, never on the batch, so a sample's result does not
    depend on the others in its batch. Paths sum in different orders; ``_float64_error``'s
    ``gamma(n, U64)`` bounds the error of any order (Higham eq. 3.5), so each is sound."""
    b, k = a.shape[:2]
    rows = a.reshape(b, k, -1)
    if k == 1 and b == 1:  # bmm of one 1-row matrix equals the per-sample product
        return per_sample_dots(a, signed, absolute)
    if k == 1 or k * rows.shape[2] < BATCHED_ROWS:
        out_s = rows.new_empty(b, k, signed.shape[2], dtype=torch.float64)
        out_a = rows.new_empty(b, k, absolute.shape[2], dtype=torch.float64)
        _batched_dots(rows, signed, absolute, out_s, out_a)
        return out_s, out_a
    return per_sample_dots(a, signed, absolute)


def per_sample_dots(
    a: torch.Tensor, signed: torch.Tensor, absolute: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dots`` with one product per sample and chunk of rows: its path for samples with
    many rows, and the reference the batched path of one row per sample equals bit for bit."""
    b, k = a.shape[:2]
    rows = a.reshape(b, k, -1)
    out_s = rows.new_empty(b, k, signed.shape[2], dtype=torch.float64)
    out_a = rows.new_empty(b, k, absolute.shape[2], dtype=torch.float64)
    step = max(1, CHUNK // rows.shape[2])
    for i in range(b):
        for first in range(0, k, step):
            part = rows[i, first : first + step].double()
            out_s[i, first : first + step] = part @ signed[i]
            if absolute.shape[2]:
                out_a[i, first : first + step] = part.abs_() @ absolute[i]
    return out_s, out_a


def _batched_dots(rows, signed, absolute, out_s, out_a) -> None:
    """``dots`` for (B, K, n) rows: ``bmm`` over chunks of at least two samples (a chunk of
    one would take ``bmm``'s single-matrix path, which MKL sums in another order than a
    batch, and the results must not depend on the chunking). A lone sample is paired with
    a copy of itself for the same reason."""
    b = rows.shape[0]
    if b == 1:
        s, a = _batched_pair(rows, signed, absolute)
        out_s.copy_(s[:1])
        out_a.copy_(a[:1])
        return
    step = max(2, CHUNK // rows[0].numel())
    starts = list(range(0, b, step))
    if len(starts) > 1 and b - starts[-1] == 1:  # no chunk of one: the one left over
        starts.pop()  # joins the chunk before it
    for first, end in zip(starts, [*starts[1:], b], strict=True):
        part = rows[first:end].double()
        torch.bmm(part, signed[first:end], out=out_s[first:end])
        if absolute.shape[2]:
            torch.bmm(part.abs_(), absolute[first:end], out=out_a[first:end])


def _batched_pair(rows, signed, absolute) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample's ``_batched_dots`` as a batch of two copies of it."""
    two = lambda t: t.expand(2, *t.shape[1:]).contiguous()  # noqa: E731
    out_s = rows.new_empty(2, rows.shape[1], signed.shape[2], dtype=torch.float64)
    out_a = rows.new_empty(2, rows.shape[1], absolute.shape[2], dtype=torch.float64)
    _batched_dots(two(rows), two(signed), two(absolute), out_s, out_a)
    return out_s, out_a


def _columns(*vectors: torch.Tensor) -> torch.Tensor:
    """Per-sample vectors (B, ...) as the columns (B, n, m) ``dots`` takes."""
    return torch.stack([v.flatten(1) for v in vectors], 2)


def _float64_error(absolute: torch.Tensor, n: int) -> torch.Tensor:
    """Upper bound of a float64 dot's exact value from its computed one (terms >= 0)."""
    return absolute * (1 + 2 * gamma(n, U64)) + TINY


def exact_shift(
    wide: Op, a: torch.Tensor, back: list[torch.Tensor], boxes: list[Box]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The constant (B, K, float64) of ``op.backward(a, *boxes)`` that makes its computed
    float32 coefficients ``back`` valid, and its rounding margin; ``wide`` is the op with
    its float64 weights. For an affine op with input ``h = c + d`` (``c`` the box centre,
    ``|d| <= r``): ``a op(h) = back h + [a op(c) - back c] + (a W - back) d``, the bracket
    computed in float64, the last term at most ``gamma(n) <|a|, |W| r>`` with ``n`` the
    row's own count of nonzero coefficients (capped by the terms of one of the op's sums)."""
    n = a[0, 0].numel()
    if wide.kind in {"reshape", "add", "input", "positive-linear", "window"}:  # copies: exact
        return a.new_zeros(a.shape[:2], dtype=torch.float64), a.new_zeros((), dtype=torch.float64)
    if wide.kind == "maxpool":
        make = lambda: _pool_columns(wide, boxes[0], n)  # noqa: E731
        key = f"_pool_columns{id(wide)}_{n}"
        ceiling, columns = memo.on_tensor(boxes[0][0], key, (boxes[0][1], wide), make)
        signed, absolute = dots(a, ceiling, columns)
        shift = (signed[..., 0] - absolute[..., 0]) / 2  # <min(a, 0), ceiling>
        return shift, _float64_error(absolute[..., 1], n)
    if wide.kind == "activation":  # ReLU: lower line through 0, so only the upper's constant
        ub, columns = memo.on_tensor(boxes[0][0], f"_relu_columns{id(wide)}_{n}",
                                     (boxes[0][1], wide, *_tensors(wide)),
                                     lambda: _relu_columns(wide, boxes[0], n))  # fmt: skip
        signed, absolute = dots(a, ub, columns)
        shift = (signed[..., 0] - absolute[..., 0]) / 2  # <min(a, 0), ub>
        return shift, _float64_error(absolute[..., 1], n)
    forward, v, centre, limit = memo.on_tensor(boxes[0][0], f"_affine_columns{id(wide)}",
                                               (boxes[0][1], wide, *_tensors(wide)),
                                               lambda: _affine_columns(wide, boxes[0]))  # fmt: skip
    at_centre, err = dots(a, forward, v)
    back_centre, _ = dots(back[0], centre, centre.new_zeros(centre.shape[0], centre.shape[1], 0))
    # each row's own count of nonzero coefficients (a zero product adds an exact zero)
    terms = nonzero_counts(a).clamp(1, max(limit, 1))
    margin = gammas(terms) * err[..., 0]
    return at_centre[..., 0] - back_centre[..., 0], _float64_error(margin, n + 1)


def nonzero_counts(a: torch.Tensor) -> torch.Tensor:
    """Nonzero elements of each row (B, K) of ``a``. ``|sign|`` sums exactly in float32 up
    to 2^24 terms, in one light pass where ``(a != 0).sum`` converts a bool copy first
    (4x the time on a 256x6 MLP's rows); a NaN row counts NaN, so its margin is NaN too."""
    rows = a.flatten(2)
    if rows.shape[2] >= 1 << 24:
        return (rows != 0).sum(2).double()
    return rows.sign().abs_().sum(2)


def _tensors(op: Op) -> tuple[torch.Tensor, ...]:
    """The op's stored tensors (weights, constants): what its kept columns depend on."""
    return tuple(v for v in vars(op).values() if isinstance(v, torch.Tensor))


def _relu_columns(wide: Op, box: Box, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns ``exact_shift`` dots a ReLU's coefficients with: its float32 chord's
    intercept ``ub``, and ``ub`` beside the rounding weight ``v`` (``n``: the row's size)."""
    _, _, _, ub = wide.relaxation.lines(*box)
    ub = ub.double()
    v = gamma(1) * unstable_magnitude(box) + 3 * gamma(n, U64) * ub.abs()
    return _columns(ub), _columns(ub, v)


def _pool_columns(wide: Op, box: Box, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns ``exact_shift`` dots a max-pool's coefficients with: the upper line's
    constant per window (the window's largest upper bound, 0 where the lower line is exact)
    and beside it the rounding weight ``v``. The coefficients are the output's moved to
    each window's chosen input (a sign split and a 0/1 product: exact), summed in float32
    where windows overlap: ``overlap - 1`` additions per input element, at most
    ``gamma(overlap - 1) |a| |z|`` with ``|z|`` the chosen input's magnitude. The two
    float64 dots and their half-difference: ``3 gamma(n) |a| |ceiling|``, as a ReLU's."""
    index, exact, top = wide.relaxation(box)
    ceiling = torch.where(exact, torch.zeros_like(top), top).double()
    chosen = magnitude(box).flatten(2).gather(2, index.flatten(2)).reshape(index.shape)
    v = 3 * gamma(n, U64) * ceiling.abs()
    if wide.overlap() > 1:
        v = v + gamma(wide.overlap() - 1) * chosen
    return _columns(ceiling), _columns(ceiling, v)


def _affine_columns(wide: Op, box: Box) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The columns ``exact_shift`` dots an affine op's coefficients with: ``op(c)`` for the
    box centre ``c``, the rounding weight ``v``, ``c`` itself, and the op's term limit."""
    lo, hi = box
    centre = ((lo + hi) / 2).double()
    radius = torch.maximum(hi.double() - centre, centre - lo.double()) * (1 + 2.0**-50)
    radial, wide_part, limit = _weighted(wide, centre, radius)
    # one column: gamma(terms) >= gamma(1) below (a zero row has no error either way)
    v = radial + wide_part / gamma(1)
    return _columns(wide.forward(centre)), _columns(v), _columns(centre), limit


def gammas(n: torch.Tensor) -> torch.Tensor:
    """``gamma`` of each count in ``n`` (float64), for float32's unit roundoff."""
    nu = n.double() * U32
    return torch.where(nu < 1, nu / (1 - nu), torch.inf)


def _weighted(op: Op, centre: torch.Tensor, radius: torch.Tensor) -> tuple:
    """Per sample (float64, out_shape) ``|W| r`` and ``v``, and the most nonzero terms of
    one of the op's float32 sums: ``<|a|, gamma(terms) |W| r + v>`` bounds every rounding
    error of ``exact_shift`` on an affine op, float32's (``terms``: a row's nonzero
    coefficients, at most the limit) and the float64 bracket's (``|W| |c| + |b|`` times
    three float64 gammas)."""
    size = centre[0].numel() + int(torch.tensor(op.out_shape).prod()) + 2
    wide = 3 * gamma(size, U64)
    if op.kind == "dense":  # a @ W: sums over a column's nonzero weights at most
        w, b = op.weight.abs(), op.bias.abs()
        return F.linear(radius, w), wide * F.linear(centre.abs(), w, b), _column_terms(op)
    if op.kind == "conv":  # conv_transpose: sums over C_out / groups * kh * kw at most
        w = op.weight.abs()
        b = op.bias.abs() if op.bias is not None else None
        terms = w.shape[0] // op.groups * _taps(op)
        conv = lambda x, bias: F.conv2d(x, w, bias, op.stride, op.padding, op.dilation, op.groups)  # noqa: E731
        return conv(radius, None), wide * conv(centre.abs(), b), terms
    if op.kind == "elementwise":  # one product per element
        scale = op.scale.abs()
        radial = scale * radius
        if not torch.equal(op.scale.float().double(), op.scale):
            # the float32 copy's scale is the float64 one rounded (a normalisation's
            # 1 / 0.3, read in float64): |a s64 - fl(a s32)| <= u |a s64| + gamma(1) |a s32|
            # <= gamma(2) |a s64|, so this op's term is charged gamma(2) where
            # ``exact_shift`` multiplies it by gamma(terms) >= gamma(1)
            radial = radial * (gamma(2) / gamma(1))
        return radial, wide * (scale * centre.abs() + op.shift.abs()), 1
    raise ValueError(f"no rounding bound for {op.kind} node {op.name!r}")


def _column_terms(op: Op) -> int:
    """The most nonzero weights in a column of a dense op's matrix: a product with a zero
    weight adds an exact zero (a convolution's matrix is mostly zeros). Cached per weight
    tensor and version, so an update in place is counted afresh."""
    key = (id(op.weight), op.weight._version)
    cached = op.__dict__.get("_column_terms")
    if cached is None or cached[0] != key:
        cached = (key, int((op.weight != 0).sum(0).max()))
        op.__dict__["_column_terms"] = cached
    return cached[1]


def _taps(op: Op) -> int:
    """Kernel positions that reach one input element: ceil(k / s) per axis without
    dilation (the others fall between the strides), k with it."""
    taps = 1
    for k, stride, dilation in zip(op.weight.shape[2:], op.stride, op.dilation, strict=True):
        taps *= -(-k // stride) if dilation == 1 else k
    return taps


def sum_error(total: torch.Tensor, box: Box) -> torch.Tensor:
    """The rounding of one float32 addition of coefficients (a node read twice)."""
    empty = box[0].new_zeros(box[0].shape[0], box[0][0].numel(), 0, dtype=torch.float64)
    _, absolute = dots(total, empty, _columns(gamma(1) * magnitude(box)))
    return _float64_error(absolute[..., 0], total[0, 0].numel())


def concretise(coeff: torch.Tensor, box: Box) -> tuple[torch.Tensor, torch.Tensor]:
    """min of ``coeff z`` over the float32 ``box``: ``coeff c - |coeff| r`` for its centre
    ``c`` and radius ``r``, in float64, and the float64 rounding bound."""
    lo, hi = box[0].double(), box[1].double()
    centre = (lo + hi) / 2
    radius = torch.maximum(hi - centre, centre - lo) * (1 + 2.0**-50)
    signed, absolute = dots(coeff, _columns(centre), _columns(radius, centre.abs()))
    n = coeff[0, 0].numel()
    value = signed[..., 0] - _float64_error(absolute[..., 0], n)
    return value, 2 * gamma(n + 2, U64) * (absolute[..., 0] + absolute[..., 1]) + TINY
