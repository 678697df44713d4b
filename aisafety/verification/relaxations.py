"""Linear relaxations of activations: f(z) >= lw z + lb and f(z) <= uw z + ub on [l, u].

* ReLU (Zhang et al. 2018, CROWN): the upper line is the chord u (z - l) / (u - l); any
  lower line a z with 0 <= a <= 1 is valid on an unstable neuron (l < 0 < u). CROWN picks
  a = 1 if u > -l else 0 (the smaller area), Fast-Lin (Weng et al. 2018) a = u / (u - l),
  alpha-CROWN optimises a. Stable neurons are exact (identity or zero).
* Sigmoid and tanh: both lines have the chord's slope k, and their intercepts are the
  exact minimum and maximum of f(z) - k z on [l, u]. That difference is smooth, so its
  extremes lie at l, u or where f'(z) = k, which has a closed form for both functions
  (at most two points, +-z*). This is sound by construction, whatever the shape of f on
  [l, u], and needs no case analysis of convex and concave parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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
class ChordRelaxation(Relaxation):
    """Sigmoid or tanh: chord slope, exact intercepts (see the module docstring)."""

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    stationary: Callable[[torch.Tensor], torch.Tensor]  # z* >= 0 with f'(+-z*) = k
    safety: float = 1e-7  # absorbs the rounding of f and of the closed forms

    def lines(self, lower, upper, lower_slope=None) -> Lines:
        width = upper - lower
        narrow = width < 1e-6
        mid = (upper + lower) / 2
        chord = (self.fn(upper) - self.fn(lower)) / torch.where(narrow, 1.0, width)
        with torch.enable_grad():  # derivative at the middle for (almost) point intervals
            point = mid.detach().requires_grad_(True)
            (tangent,) = torch.autograd.grad(self.fn(point).sum(), point)
        slope = torch.where(narrow, tangent, chord).clamp(min=0)
        z_star = self.stationary(slope)
        points = [lower, upper, (-z_star).clamp(lower, upper), z_star.clamp(lower, upper)]
        gaps = torch.stack([self.fn(p) - slope * p for p in points])
        margin = self.safety * (1 + gaps.abs().amax(0))
        return slope, gaps.amin(0) - margin, slope, gaps.amax(0) + margin


def _sigmoid_stationary(k: torch.Tensor) -> torch.Tensor:
    """z >= 0 with s (1 - s) = k for s = sigmoid(z), k in (0, 1/4]."""
    root = (1 - 4 * k.clamp(max=0.25)).clamp(min=0).sqrt()
    s = ((1 + root) / 2).clamp(max=1 - 1e-12)
    return torch.log(s / (1 - s).clamp(min=1e-300))


def _tanh_stationary(k: torch.Tensor) -> torch.Tensor:
    """z >= 0 with 1 - tanh(z)^2 = k, k in (0, 1]."""
    t = (1 - k.clamp(max=1)).clamp(min=0).sqrt().clamp(max=1 - 1e-12)
    return torch.atanh(t)


RELU = ReluRelaxation()
SIGMOID = ChordRelaxation("sigmoid", torch.sigmoid, _sigmoid_stationary)
TANH = ChordRelaxation("tanh", torch.tanh, _tanh_stationary)
