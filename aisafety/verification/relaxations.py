"""Linear relaxations of activations: f(z) >= lw z + lb and f(z) <= uw z + ub on [l, u].

* ReLU (Zhang et al. 2018, CROWN): the upper line is the chord u (z - l) / (u - l); any
  lower line a z with 0 <= a <= 1 is valid on an unstable neuron (l < 0 < u). CROWN picks
  a = 1 if u > -l else 0 (the smaller area), Fast-Lin (Weng et al. 2018) a = u / (u - l),
  alpha-CROWN optimises a. Stable neurons are exact (identity or zero).
* Sigmoid and tanh: each intercept is the exact minimum (maximum) of f(z) - k z on
  [l, u] for the slope k as stored. That difference is smooth, so its extremes lie at l,
  u or where f'(z) = k, which has a closed form for both functions (at most two points,
  +-z*). So a line is sound whatever its slope, and needs no case analysis of convex and
  concave parts; computed in float64, widened by 1e-7 relative (float64's own rounding of
  f and z* is ~1e-16) and rounded outwards to the lines' dtype. CROWN (and every
  intermediate pass) takes CROWN's slopes as auto_LiRPA picks them (``tangent_slopes``:
  Zhang et al. 2018's tangents and chords, with auto_LiRPA's "smoothness enhancement" on
  intervals across 0); on the eran sigmoid net they are far tighter than the chord's
  slope for both lines (docs/certification.md, bench/sigmoid_lines.py). alpha-CROWN
  searches one lower and one upper slope per row and neuron between the least and
  largest f' on [l, u], starting from the chord.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from aisafety.verification import memo

Lines = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class Relaxation:
    def lines(self, lower: torch.Tensor, upper: torch.Tensor, lower_slope=None) -> Lines:
        raise NotImplementedError


def round_up(x: torch.Tensor) -> torch.Tensor:
    """The smallest float32 values >= ``x`` (float64): a cast rounds to nearest."""
    y = x.float()
    return torch.where(y.double() < x, torch.nextafter(y, y.new_tensor(torch.inf)), y)


def _chord_intercept(lower: torch.Tensor, upper: torch.Tensor, uw: torch.Tensor) -> torch.Tensor:
    """A float32 intercept ``ub`` with relu(z) <= uw z + ub on [l, u] for the float32 slope
    ``uw`` as rounded: relu - uw z is convex, so its maximum is at l or u; the products of
    float32 numbers are exact in float64 and the one float64 subtraction is covered by
    2^-50 relative before rounding up."""
    lo, hi, w = lower.double(), upper.double(), uw.double()
    need = torch.maximum(-w * lo, hi - w * hi)
    return round_up(need + need.abs() * 2.0**-50)


def relu_default_slope(lower: torch.Tensor, upper: torch.Tensor, mode: str) -> torch.Tensor:
    """The lower line's slope on unstable neurons: 'adaptive' (CROWN) or 'parallel' (Fast-Lin)."""
    if mode == "parallel":
        return upper.clamp(min=0) / (upper - lower).clamp(min=1e-12)
    return (upper > -lower).to(lower.dtype)


class ReluRelaxation(Relaxation):
    name = "relu"

    def lines(self, lower, upper, lower_slope=None) -> Lines:
        unstable = (lower < 0) & (upper > 0)
        active = (lower >= 0).to(lower.dtype)
        width = (upper - lower).clamp(min=1e-12)
        uw = torch.where(unstable, upper / width, active)
        if lower.dtype == torch.float32:  # rounding could put the chord below relu
            ub = torch.where(unstable, _chord_intercept(lower, upper, uw), 0.0)
        else:
            ub = torch.where(unstable, -uw * lower, torch.zeros_like(lower))
        if lower_slope is None:
            lower_slope = relu_default_slope(lower, upper, "adaptive")
        if lower_slope.dim() > lower.dim():  # one slope per output row (B, K, ...)
            unstable, active = unstable.unsqueeze(1), active.unsqueeze(1)
        lw = torch.where(unstable, lower_slope, active)
        return lw, torch.zeros_like(lower), uw, ub


@dataclass
class SShapeRelaxation(Relaxation):
    """Sigmoid or tanh: any slopes, exact intercepts (see the module docstring)."""

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    derivative: Callable[[torch.Tensor], torch.Tensor]
    stationary: Callable[[torch.Tensor], torch.Tensor]  # z* >= 0 with f'(+-z*) = k
    derivatives: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # f', f'' from f
    safety: float = 1e-7  # absorbs the float64 rounding of f and of the closed forms
    rule: str = "tangent"  # CROWN's slopes (``tangent_slopes``), or "chord" for both lines

    def lines(self, lower, upper, lower_slope=None) -> Lines:
        """Both lines with ``default_slopes`` or, given ``lower_slope`` (B, K, 2, ...): one
        lower and one upper slope per row as positions in [0, 1] (``slope_range``). In
        ``lower``'s dtype; computed in float64 from the slopes as stored in that dtype, the
        intercepts rounded outwards.

        CROWN's lines depend on the box alone, and a CROWN pass on n layers bounds every
        layer's input by a backward pass through all the layers before it: n (n + 1) / 2
        computations of the same lines (21 on eran's 6x200) where n are needed. So they are
        kept on the box while it is unchanged (``memo.py``; callers must not modify them in
        place); searched slopes (``lower_slope``) differ per pass and are never kept."""
        if lower_slope is not None:
            return self._lines(lower, upper, lower_slope)
        key = f"_sshape_lines{id(self)}_{self.rule}_{self.safety}"
        return memo.on_tensor(lower, key, (upper, self), lambda: self._lines(lower, upper))

    def _lines(self, lower, upper, lower_slope=None) -> Lines:
        """``lines``, computed."""
        dtype, lo, hi = lower.dtype, lower.double(), upper.double()
        if lower_slope is None:
            down, up = (t.to(dtype) for t in self.default_slopes(lo, hi))
        else:
            lo, hi = lo.unsqueeze(1), hi.unsqueeze(1)
            least, most = self.slope_range(lo, hi)
            down, up = (least + t.double() * (most - least) for t in lower_slope.unbind(2))
            down, up = down.to(dtype), up.to(dtype)
        low_gap = self.gap(lo, hi, down.double(), lowest=True)
        high_gap = self.gap(lo, hi, up.double(), lowest=False)
        return down, -_outwards(-low_gap, dtype), up, _outwards(high_gap, dtype)

    def default_slopes(
        self, lo: torch.Tensor, hi: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """CROWN's lower and upper slope (float64) by ``rule``."""
        if self.rule == "chord":
            chord = self.chord(lo, hi)
            return chord, chord
        return self.tangent_slopes(lo, hi)

    def chord(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """The chord's slope (float64); the derivative at the middle of (almost) points."""
        width = hi - lo
        narrow = width < 1e-9
        chord = (self.fn(hi) - self.fn(lo)) / torch.where(narrow, 1.0, width)
        return torch.where(narrow, self.derivative((lo + hi) / 2), chord).clamp(min=0)

    def tangent_slopes(
        self, lo: torch.Tensor, hi: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """CROWN's slopes (float64), lower and upper line, as auto_LiRPA's ``BoundSShaped``
        picks them: on a convex (u <= 0) interval the tangent at the middle below and the
        chord above, the mirror image on a concave one (l >= 0); on a mixed one each line
        is the chord where the chord does not cross f, else the tangent through the far
        end (touching f at d), or the tangent at the middle m where d is on the far side of
        m (auto_LiRPA's "smoothness enhancement"). Only tightness depends on this choice."""
        chord, m = self.chord(lo, hi), (lo + hi) / 2
        mid = self.derivative(m)
        across = (lo < 0) & (hi > 0)
        # the chord crosses f: the tangent through the far end instead
        low_end, up_end = (
            across & (chord >= self.derivative(lo)),
            across & (chord >= self.derivative(hi)),
        )
        low_d, up_d = self._touch(lo, hi, chord, low_end, up_end)
        low_mixed = torch.where(low_end, self.derivative(torch.minimum(low_d, m)), chord)
        up_mixed = torch.where(up_end, self.derivative(torch.maximum(up_d, m)), chord)
        down = torch.where(hi <= 0, mid, torch.where(lo >= 0, chord, low_mixed))
        up = torch.where(hi <= 0, chord, torch.where(lo >= 0, mid, up_mixed))
        return down, up

    def _touch(self, lo, hi, chord, low_end, up_end) -> tuple[torch.Tensor, torch.Tensor]:
        """Where ``low_end``: the point d in [l, 0] whose tangent passes through (u, f(u));
        where ``up_end``: the one in [0, u] whose tangent passes through (l, f(l)); 0
        elsewhere. Both in one search (``_tangent_points``) over just those intervals.
        Across 0 the tangent through an end has a slope of at least the chord's (f lies on
        the line's far side beyond d), so d is within z*(chord) of 0: the search starts
        there (the interval's end where nearer)."""
        shape, reach = lo.shape, self.stationary(chord).flatten()
        lo, hi = lo.flatten(), hi.flatten()
        i, j = torch.nonzero(low_end.flatten()).flatten(), torch.nonzero(up_end.flatten()).flatten()
        anchor = torch.cat([hi[i], lo[j]])
        far = torch.cat([lo[i], hi[j]])
        start = torch.cat([torch.maximum(lo[i], -reach[i]), torch.minimum(hi[j], reach[j])])
        below = torch.arange(len(anchor), device=anchor.device) < len(i)
        d = self._tangent_points(anchor, far, start, below)
        low_d, up_d = torch.zeros_like(lo), torch.zeros_like(lo)
        low_d[i], up_d[j] = d[: len(i)], d[len(i) :]
        return low_d.reshape(shape), up_d.reshape(shape)

    def _tangent_points(self, anchor, far, start, below) -> torch.Tensor:
        """The root d between ``far`` and 0 of g(d) = f(d) + f'(d) (a - d) - f(a), a =
        ``anchor``: the tangent at d passes through (a, f(a)); ``below``: a lower line's (d
        <= 0, ``far`` = l), else an upper line's (d >= 0, ``far`` = u). g rises on the side
        of 0 opposite a (g' = f''(d) (a - d) > 0 there), so the root splits the bracket into
        g <= 0 on its left and g > 0 on its right. Newton's method on g / (a - d)^2 (g has a
        double root at a, which slows plain Newton near the inflection point to a linear
        rate) from ``start``, inside the bracket of the last point on each side (a step out
        of it halves it instead), until a step is below 1e-12 (relative) or g is within the
        rounding of its terms (bisection's tests of g's sign are no finer there): 11-12
        steps at most on 20,000 random intervals (tests/test_sshape_touch.py)."""
        target = self.fn(anchor)
        zero = torch.zeros_like(far)
        left, right = torch.where(below, far, zero), torch.where(below, zero, far)
        side = torch.where(below, 1.0, -1.0).to(far)  # |a - d| = side (a - d), |d| = -side d
        x, done = start, torch.zeros_like(below)
        for _ in range(TOUCH_STEPS):
            if done.all():
                break
            y = self.fn(x)
            k, curve = self.derivatives(y)
            gap = anchor - x
            g = y + k * gap - target
            step = x - g / (curve * gap + 2 * g / gap)
            left, right = torch.where(g <= 0, x, left), torch.where(g <= 0, right, x)
            # g's terms round by eps times |f(d)| + |f(a)| <= 2 and f' |a - d| (f' >= 0), and
            # f' from f can cancel (1 - y^2 near y = -1): eps absolute, times |a - d|
            noise = 16 * _EPS64 * (2 + (1 + k) * side * gap)
            now = ((step - x).abs() <= 1e-12 * (1 - side * x)) | (g.abs() <= noise)
            inside = (step >= left) & (step <= right)
            halve = torch.where(now, x, (left + right) / 2)  # converged: no halving
            x = torch.where(done, x, torch.where(inside, step, halve))
            done = done | now
        return x

    def slope_range(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The least and largest f' on [lo, hi] (f' is even and falls away from 0): the
        slopes of the tangents, so of every line worth searching."""
        least = torch.minimum(self.derivative(lo), self.derivative(hi))
        return least, self.derivative(torch.where(lo * hi <= 0, 0.0, lo.abs().minimum(hi.abs())))

    def initial_alpha(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """The chord's slope as a position in ``slope_range``, for both lines (B, 2, ...):
        the search's start. CROWN's own slopes (``tangent_slopes``) start it worse (eran
        1211, 20 steps: -5.47 against -3.14; docs/certification.md)."""
        lo, hi = lo.double(), hi.double()
        least, most = self.slope_range(lo, hi)
        span = most - least
        at = (self.chord(lo, hi) - least) / torch.where(span > 0, span, 1.0)
        return at.clamp(0, 1).unsqueeze(1).expand(-1, 2, *lo.shape[1:]).to(lo.dtype)

    def gaps(self, lo: torch.Tensor, hi: torch.Tensor, slope: torch.Tensor) -> Lines:
        """The minimum and maximum of f(z) - slope z on [lo, hi] (``gap``)."""
        return self.gap(lo, hi, slope, lowest=True), self.gap(lo, hi, slope, lowest=False)

    def gap(self, lo, hi, slope: torch.Tensor, lowest: bool) -> torch.Tensor:
        """The minimum (``lowest``) or maximum of f(z) - slope z on [lo, hi], widened by
        ``safety``: f - kz is smooth, so it lies at lo, hi or where f' = k (+-z*, clamped
        inside). One side only: a line needs one (the search's ``_extreme`` costs)."""
        z_star = self.stationary(slope)
        points = [lo, hi, torch.minimum(torch.maximum(-z_star, lo), hi),
                  torch.minimum(torch.maximum(z_star, lo), hi)]  # fmt: skip
        values = torch.stack([self.fn(p) - slope * p for p in points])
        margin = self.safety * (1 + values.abs().amax(0))
        if lowest:
            return -_extreme(-values, points) - margin
        return _extreme(values, points) + margin


def _extreme(values: torch.Tensor, points: list[torch.Tensor]) -> torch.Tensor:
    """``values.amax(0)`` (values of f - kz at ``points``); with gradients (the slope
    search's passes) its gradient is the mean of those of every point whose value is within
    ``TIE`` x (1 + |l| + |u|) of the largest. Why: CROWN's lines are chords and tangents
    through an end, so their extreme is reached at two points at once, and the search
    starts there; which of the two the float32 box's last bits put on top picked the
    first step's gradient (-l or -z* for the slope: 5x apart on fuzz seed 2137), Adam's
    second moment kept that step's size, and a sample's bound moved by 1.2e-3 with its
    batch (docs/certification.md, "A tie at the search's start"). The value is the exact
    maximum either way (an infinite one too), so every line stays sound and a pass
    without gradients is unchanged bit for bit: only the search's direction at a tie."""
    top = values.amax(0)
    if not values.requires_grad:
        return top
    scale = TIE * (1 + points[0].abs() + points[1].abs()).detach()
    near = (top - values).detach() <= scale
    mean = values.masked_fill(~near, 0.0).sum(0) / near.sum(0)
    return top.detach() + (mean - mean.detach()).nan_to_num(0.0)  # 0 but on an infinite box


def _outwards(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The smallest values of ``dtype`` >= ``x`` (float64); a slope search's pass (with
    gradients, re-bounded soundly after) is only cast."""
    if dtype == torch.float32 and not x.requires_grad:
        return round_up(x)
    return x.to(dtype)


_EPS64 = torch.finfo(torch.float64).eps
# near ties of ``_extreme``, relative to the box: a search pass's float32 box is ~1e-7
# relative from the box its start slopes were chosen on (fuzz seed 2137: l 1.2e-7 apart
# alone and batched, the tied values 1.1e-8 apart), so 1e-6 x (1 + |l| + |u|) holds it
# The band's edge is a switch of its own, which a long search crosses by rounding now and
# then; no width or ramp removed that without losing tightness (docs/certification.md,
# session 19)
TIE = 1e-6
TOUCH_STEPS = 40  # Newton steps at most in ``_tangent_points`` (12 measured at most)


def _sigmoid_stationary(k: torch.Tensor) -> torch.Tensor:
    """z >= 0 with s (1 - s) = k for s = sigmoid(z), k in (0, 1/4]."""
    root = (1 - 4 * k.clamp(max=0.25)).clamp(min=0).sqrt()
    s = ((1 + root) / 2).clamp(max=1 - 1e-12)
    return torch.log(s / (1 - s).clamp(min=1e-300))


def _tanh_stationary(k: torch.Tensor) -> torch.Tensor:
    """z >= 0 with 1 - tanh(z)^2 = k, k in (0, 1]."""
    t = (1 - k.clamp(max=1)).clamp(min=0).sqrt().clamp(max=1 - 1e-12)
    return torch.atanh(t)


def _sigmoid_derivative(z: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(z)
    return s * (1 - s)


def _tanh_derivative(z: torch.Tensor) -> torch.Tensor:
    return 1 - torch.tanh(z) ** 2


def _sigmoid_derivatives(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f' and f'' at z from y = sigmoid(z): y (1 - y) and y (1 - y) (1 - 2 y)."""
    k = y * (1 - y)
    return k, k * (1 - 2 * y)


def _tanh_derivatives(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f' and f'' at z from y = tanh(z): 1 - y^2 and -2 y (1 - y^2)."""
    k = 1 - y * y
    return k, -2 * y * k


RELU = ReluRelaxation()
SIGMOID = SShapeRelaxation(
    "sigmoid", torch.sigmoid, _sigmoid_derivative, _sigmoid_stationary, _sigmoid_derivatives
)
TANH = SShapeRelaxation("tanh", torch.tanh, _tanh_derivative, _tanh_stationary, _tanh_derivatives)
