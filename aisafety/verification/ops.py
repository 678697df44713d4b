"""The operations a bound graph is made of, each with its interval and backward rules.

Every op maps the per-sample value of its input node(s) to its output; batches stay in the
first dimension. Two rules per op:

* ``interval(*boxes)`` -> the box of the output given boxes of the inputs (IBP);
* ``backward(a, *boxes)`` -> for a linear function ``A out`` (``a`` of shape
  ``(B, K, *out_shape)``), the coefficients on each input and the constant it adds, such
  that ``A out >= sum_i A_i in_i + bias`` over the input boxes. Affine ops are exact;
  activations use a linear relaxation (``relaxations.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from aisafety.verification.ibp_rounding import rounded, widen, widen_evaluated
from aisafety.verification.relaxations import RELU, Relaxation

Box = tuple[torch.Tensor, torch.Tensor]


def _sum_tail(t: torch.Tensor) -> torch.Tensor:
    """Sum over every dimension after (B, K)."""
    return t.flatten(2).sum(2)


def _row_dot(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """sum over the tail of ``a * t`` (B, K), ``t`` per sample (B, ...) or per row: a
    batched matrix-vector product for the former, with no (B, K, ...) temporary. One row
    per sample (branch and bound's domains: B in the hundreds, K = 1) is one product and
    sum: with a gemv per sample there, ``bab`` bounded 1.47x fewer domains per CPU second
    (mnistfc 256x4 prop_5_0.03, paired; docs/certification.md)."""
    if t.dim() == a.dim():
        return _sum_tail(a * t)
    if a.shape[1] == 1:  # the (B, 1, ...) product is a's size: no larger temporary
        return (a.flatten(1) * t.flatten(1)).sum(1, keepdim=True)
    rows, vectors = a.flatten(2), t.flatten(1)  # one gemv per sample: bmm's (n, 1) is slow
    return torch.stack([torch.mv(rows[i], vectors[i]) for i in range(a.shape[0])])


def _magnitude(box: Box) -> torch.Tensor:
    """max |z| over the box."""
    return torch.maximum(box[0].abs(), box[1].abs())


# a transposed convolution to at most this many channels goes as a product and a fold
FOLD_CHANNELS = 3


def split_signs(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a.clamp(min=0), a.clamp(max=0)


@dataclass
class Op:
    """One node of the graph: ``inputs`` are indices of earlier nodes."""

    name: str  # the traced node's name, for messages
    inputs: list[int]
    out_shape: tuple[int, ...]  # per sample
    kind: str = field(default="op", init=False)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def interval(self, *boxes: Box) -> Box:
        raise NotImplementedError

    def backward(self, a: torch.Tensor, *boxes: Box) -> tuple[list[torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def to(self, dtype: torch.dtype) -> None:
        """Cast stored tensors (weights, constants) to ``dtype``; a copy in another dtype is
        detached (verification), the same dtype keeps the network's parameter (training)."""
        for key, value in vars(self).items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                setattr(self, key, value if value.dtype == dtype else value.detach().to(dtype))


@dataclass
class Input(Op):
    kind: str = field(default="input", init=False)


@dataclass
class Dense(Op):
    """y = W x + b on flat vectors (nn.Linear, Gemm, F.linear, matmul by a constant)."""

    weight: torch.Tensor = None  # type: ignore[assignment]
    bias: torch.Tensor = None  # type: ignore[assignment]
    kind: str = field(default="dense", init=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def interval(self, box: Box) -> Box:
        centre, radius = (box[1] + box[0]) / 2, (box[1] - box[0]) / 2
        mid, spread = self.forward(centre), F.linear(radius, self.weight.abs())
        lo, hi = mid - spread, mid + spread
        if not rounded(lo):  # a float32 (training) graph: no margin, no work for it
            return lo, hi
        size = F.linear(centre.abs(), self.weight.abs()) + spread
        size = size if self.bias is None else size + self.bias.abs()
        return widen(lo, hi, size, self.weight.shape[1] + 1)

    def backward(
        self, a: torch.Tensor, box: Box, constant: bool = True
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Without ``constant`` the constant is left at zero (a caller that computes it)."""
        bias = a @ self.bias if constant else a.new_zeros(a.shape[:2])
        return [a @ self.weight], bias


@dataclass
class Conv(Op):
    """nn.Conv2d (any stride, padding, dilation, groups)."""

    weight: torch.Tensor = None  # type: ignore[assignment]
    bias: torch.Tensor = None  # type: ignore[assignment]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    in_shape: tuple[int, ...] = ()
    kind: str = field(default="conv", init=False)

    def conv(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """This op's convolution (stride, padding, dilation, groups) with another weight and
        bias: ``|W|`` for interval radii, and the zonotope's and float64 margin's passes."""
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x, self.weight, self.bias)

    def interval(self, box: Box) -> Box:
        centre, radius = (box[1] + box[0]) / 2, (box[1] - box[0]) / 2
        mid, spread = self.forward(centre), self.conv(radius, self.weight.abs(), None)
        lo, hi = mid - spread, mid + spread
        if not rounded(lo):  # a float32 (training) graph: no margin, no work for it
            return lo, hi
        size = self.conv(centre.abs(), self.weight.abs(), None) + spread
        if self.bias is not None:
            size = size + self.bias.abs().view(-1, 1, 1)
        return widen(lo, hi, size, self.weight[0].numel() + 1)

    def backward(
        self, a: torch.Tensor, box: Box, constant: bool = True
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Without ``constant`` the constant is left at zero (a caller that computes it)."""
        b, k = a.shape[:2]
        flat = a.reshape(b * k, *self.out_shape)
        size = [
            (self.out_shape[1 + i] - 1) * self.stride[i] - 2 * self.padding[i]
            + self.dilation[i] * (self.weight.shape[2 + i] - 1) + 1
            for i in range(2)
        ]  # fmt: skip
        extra = tuple(self.in_shape[1 + i] - size[i] for i in range(2))
        if self._folds():
            back = self._folded(flat)
        else:
            back = F.conv_transpose2d(
                flat, self.weight, None, self.stride, self.padding, extra, self.groups,
                self.dilation,
            )  # fmt: skip
        bias = a.new_zeros(b, k)
        if constant and self.bias is not None:
            bias = (a.sum((3, 4)) * self.bias).sum(2)
        return [back.reshape(b, k, *self.in_shape)], bias

    def _folds(self) -> bool:
        """Whether ``backward`` takes ``_folded``: an image's first layer (at most
        ``FOLD_CHANNELS`` input channels, no groups) whose columns are no larger than the
        coefficients they come from (the memory estimate's rule size holds)."""
        c_out, c_in, kh, kw = self.weight.shape
        return self.groups == 1 and c_in <= FOLD_CHANNELS and c_in * kh * kw <= c_out

    def _folded(self, flat: torch.Tensor) -> torch.Tensor:
        """``conv_transpose2d`` of ``flat`` (N, C_out, H, W) as one matrix product into
        columns and ``F.fold``: each input element is the same sum of ``C_out * taps``
        products, grouped otherwise (the rounding bounds hold for any grouping), and 2-3x
        faster where the transposed convolution has one to three output channels
        (docs/certification.md)."""
        c_out = self.weight.shape[0]
        kernel = tuple(self.weight.shape[2:])
        cols = self.weight.reshape(c_out, -1).t() @ flat.reshape(flat.shape[0], c_out, -1)
        size = tuple(self.in_shape[1:])
        return F.fold(cols, size, kernel, self.dilation, self.padding, self.stride)


@dataclass
class Elementwise(Op):
    """y = scale * x + shift, per element (normalisation, eval BatchNorm, +-*/ a constant)."""

    scale: torch.Tensor = None  # type: ignore[assignment]  # out_shape
    shift: torch.Tensor = None  # type: ignore[assignment]
    # float32_rounding.py: the float32 evaluation's roundings in a row and the sum of the
    # absolute values of its constant terms (out_shape; None: |shift|, one constant)
    roundings: int = 3
    terms: torch.Tensor | None = None
    kind: str = field(default="elementwise", init=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift

    def interval(self, box: Box) -> Box:
        lo, hi = self.forward(box[0]), self.forward(box[1])
        size = _magnitude(box) * self.scale.abs() + self.shift.abs()
        return widen(torch.minimum(lo, hi), torch.maximum(lo, hi), size, 2)

    def backward(self, a: torch.Tensor, box: Box) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [a * self.scale], _sum_tail(a * self.shift)


@dataclass
class Reshape(Op):
    """Flatten / view / reshape: the same values in another per-sample shape."""

    in_shape: tuple[int, ...] = ()
    kind: str = field(default="reshape", init=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.out_shape)

    def interval(self, box: Box) -> Box:
        return self.forward(box[0]), self.forward(box[1])

    def backward(self, a: torch.Tensor, box: Box) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [a.reshape(*a.shape[:2], *self.in_shape)], a.new_zeros(a.shape[:2])


@dataclass
class PositiveLinear(Op):
    """A linear map with non-negative coefficients (average pooling): monotone for IBP.
    ``permutation``: it only moves values (a transpose, NHWC <-> NCHW), so every rule is
    exact in any dtype (no sum, no product)."""

    fn: Callable[[torch.Tensor], torch.Tensor] = None  # type: ignore[assignment]
    in_shape: tuple[int, ...] = ()
    permutation: bool = False
    kind: str = field(default="positive-linear", init=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def interval(self, box: Box) -> Box:
        """Monotone; a sum (average pooling) rounds: at most the input's size terms."""
        lo, hi = self.fn(box[0]), self.fn(box[1])
        if self.permutation:
            return lo, hi
        return widen(lo, hi, self.fn(_magnitude(box)), box[0][0].numel() + 1)

    def backward(self, a: torch.Tensor, box: Box) -> tuple[list[torch.Tensor], torch.Tensor]:
        b, k = a.shape[:2]
        zeros = a.new_zeros(b * k, *self.in_shape)
        _, pullback = torch.func.vjp(self.fn, zeros)
        (back,) = pullback(a.reshape(b * k, *self.out_shape))
        return [back.reshape(b, k, *self.in_shape)], a.new_zeros(b, k)


@dataclass
class Add(Op):
    """The sum of two traced values (residual connections)."""

    kind: str = field(default="add", init=False)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x + z

    def interval(self, first: Box, second: Box) -> Box:
        size = _magnitude(first) + _magnitude(second)
        return widen(first[0] + second[0], first[1] + second[1], size, 1)

    def backward(self, a, first: Box, second: Box) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [a, a], a.new_zeros(a.shape[:2])


@dataclass
class Activation(Op):
    """A monotone elementwise nonlinearity (ReLU, sigmoid, tanh) with its relaxation."""

    fn: Callable[[torch.Tensor], torch.Tensor] = None  # type: ignore[assignment]
    relaxation: Relaxation = None  # type: ignore[assignment]
    kind: str = field(default="activation", init=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def interval(self, box: Box) -> Box:
        """``[f(l), f(u)]`` (``f`` is monotone): exact for ReLU, widened outwards for the
        others (``torch.sigmoid``/``tanh`` are not correctly rounded; ``widen_evaluated``)."""
        lo, hi = self.fn(box[0]), self.fn(box[1])
        return (lo, hi) if self.relaxation is RELU else widen_evaluated(lo, hi)

    def backward(
        self,
        a: torch.Tensor,
        box: Box,
        lower_slope: torch.Tensor | None = None,
        constant: bool = True,
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``lower_slope`` (alpha-CROWN) replaces the default lower line's slope; without
        ``constant`` the constant is left at zero (a caller that computes it itself)."""
        lw, lb, uw, ub = self.relaxation.lines(box[0], box[1], lower_slope)
        pos = torch.relu(a)
        neg = a - pos  # exact: one of the two is zero
        zero = a.new_zeros(a.shape[:2])
        bias = _row_dot(pos, lb) + _row_dot(neg, ub) if constant else zero
        lw, uw = (t if t.dim() == a.dim() else t.unsqueeze(1) for t in (lw, uw))
        # pos * lw + neg * uw: one term is zero, so this is the one rounded product (added
        # in place: a tensor of ``a``'s size fewer; ``neg`` stays, autograd may need it)
        return [(neg * uw).addcmul_(pos, lw)], bias


@dataclass
class MaxPool(Op):
    """Max-pooling (nn.MaxPool2d, F.max_pool2d): monotone for IBP, and a linear relaxation
    for the backward passes (DeepPoly; auto_LiRPA's ``BoundMaxPool``). In each window, the
    element ``i`` of largest lower bound gives ``y >= x_i`` (a max is at least any element).
    Above: ``y = x_i`` exactly when ``l_i`` is at least every other element's upper bound
    (``i`` always wins), else the window's largest upper bound, a constant (never looser on
    the box than a plane through ``x_i``). Padding is -inf, as PyTorch pads."""

    fn: Callable[[torch.Tensor], torch.Tensor] = None  # type: ignore[assignment]
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False
    in_shape: tuple[int, ...] = ()
    kind: str = field(default="maxpool", init=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def interval(self, box: Box) -> Box:
        return self.fn(box[0]), self.fn(box[1])

    def backward(
        self, a: torch.Tensor, box: Box, constant: bool = True
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Without ``constant`` the constant is left at zero (a caller that computes it)."""
        b, k = a.shape[:2]
        index, exact, top = self.relaxation(box)
        pos, neg = split_signs(a)
        coeff = (pos + neg * exact.unsqueeze(1)).flatten(3)  # (B, K, C, out windows)
        bias = a.new_zeros(b, k)
        if constant:
            bias = _row_dot(neg, torch.where(exact, torch.zeros_like(top), top))
        channels, windows = coeff.shape[2:]
        back = a.new_zeros(b, k, channels, self.in_shape[1] * self.in_shape[2])
        where = index.reshape(b, 1, channels, windows).expand(b, k, channels, windows)
        back.scatter_add_(3, where, coeff)
        return [back.reshape(b, k, *self.in_shape)], bias

    def relaxation(self, box: Box) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per output (B, C, H', W'): the flat input index of the window's element of largest
        lower bound, whether that element always wins (the relaxation is exact), and the
        window's largest upper bound."""
        lo, hi = box
        pool = (self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode)
        lower, index = F.max_pool2d(lo, *pool, return_indices=True)
        height, width = self.in_shape[1:]
        flat = torch.arange(height * width, dtype=torch.float64, device=lo.device)
        positions = self.windows(flat.reshape(1, 1, height, width), -1.0)  # (1, 1, kk, L)
        uppers = self.windows(hi, -torch.inf)  # (B, C, kk, L)
        chosen = positions == index.flatten(2).unsqueeze(2).to(torch.float64)
        others = uppers.masked_fill(chosen, -torch.inf).amax(2).reshape(lower.shape)
        return index, lower >= others, F.max_pool2d(hi, *pool)

    def overlap(self) -> int:
        """The most windows one input element is in (1: the windows do not overlap)."""
        count = 1
        for axis in (0, 1):
            extent = self.dilation[axis] * (self.kernel[axis] - 1) + 1
            count *= -(-extent // self.stride[axis])
        return count

    def windows(self, x: torch.Tensor, fill: float) -> torch.Tensor:
        """The pooling windows of ``x`` (N, C, H, W) as (N, C, kernel elements, windows),
        padded with ``fill``; the right edge padded or cut to the last window (ceil_mode)."""
        pads = []
        for axis in (1, 0):  # F.pad lists the last axis first
            size, out = self.in_shape[1 + axis], self.out_shape[1 + axis]
            extent = (
                (out - 1) * self.stride[axis] + self.dilation[axis] * (self.kernel[axis] - 1) + 1
            )
            pads += [self.padding[axis], extent - size - self.padding[axis]]
        padded = F.pad(x, pads, value=fill)
        cols = F.unfold(padded, self.kernel, self.dilation, 0, self.stride)
        return cols.reshape(x.shape[0], x.shape[1], -1, cols.shape[-1])


@dataclass
class Window(Op):
    """The input's values at the flat positions ``index`` (one per output element): a
    receptive-field crop's sub-window of a node that a residual branch reads less of than
    the other (``receptive.py``). A copy, exact in any dtype."""

    index: torch.Tensor = None  # type: ignore[assignment]
    kind: str = field(default="window", init=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).index_select(1, self.index).reshape(-1, *self.out_shape)

    def interval(self, box: Box) -> Box:
        return self.forward(box[0]), self.forward(box[1])

    def backward(self, a: torch.Tensor, box: Box) -> tuple[list[torch.Tensor], torch.Tensor]:
        b, k = a.shape[:2]
        back = a.new_zeros(b, k, box[0][0].numel())
        back.index_copy_(2, self.index, a.flatten(2))
        return [back.reshape(b, k, *box[0].shape[1:])], a.new_zeros(b, k)
