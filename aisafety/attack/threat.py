"""Threat models: one object per norm owns the geometry every attack of that norm shares.

An attack moves inside ``{x' : ||x' - x||_p <= eps} ∩ [0, 1]^d``. What that set means in
code lives here once, instead of in each attack:

- ``project(x_adv, x, eps)``: the step projection, back into the ball and the box;
- ``contain(x_adv, x, eps)``: the base class's final guarantee on whatever an attack returns;
- ``random_start(x, eps, generator, surface)``: a random point of the ball (or its sphere),
  drawn from a batch's generator (training) or per-sample streams (attacks);
- ``ascent(grad)``: the steepest-ascent direction of unit size in the norm.

l-inf: ``project`` clamps to the per-pixel bounds ``[max(x - eps, 0), min(x + eps, 1)]``
(equal, bit for bit, to clipping to the ball and then to the box). ``contain`` clips the
perturbation ``x_adv - x`` instead; the two agree up to float rounding and are kept apart
so that stored results stay bit-identical to the attacks' history.

l2: ``contain`` (the base class's final guarantee, and the adversarial-hypervolume
frontier's steps) is the exact Euclidean projection onto the ball intersected with the box
(``project_l2_box``); for a candidate inside the box it is the radial shrink. ``project``,
the attacks' step rule, is a point of both sets but not the closest: clip to the box, then
shrink onto the ball (ART's order). Measured on ``mnist-cnn-pgd-at`` at l2 2.0 (1,000 images,
20 steps): APGD-CE-l2 leaves 59.1 % robust with this step rule and 59.8 % with the exact
projection, APGD-DLR-l2 60.4 % and 61.5 %; shrinking first and clipping after (Croce &
Hein's reference code) is weaker still, 60.8 % with APGD-CE-l2 (3 seeds, commit daabff7), as
the clip removes budget where pixels saturate (most of an MNIST image is 0). The frontier
uses the exact projection because its few steps per budget must land on the sphere's
closest point (a linear model's frontier is exact that way; clipping first turns the step's
direction and misses it in 5 steps).

l1: the Euclidean projection onto the l1 ball (Duchi et al. 2008), then the box (SLIDE's
order, Tramèr & Boneh's code); the box can only shrink an l1 perturbation.
"""

from __future__ import annotations

import math

import torch

from aisafety.attack.streams import RandomSource, rand, randint, randn
from aisafety.interfaces import Norm


def per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (n,) shaped to broadcast over the samples of ``like`` (n, ...)."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def normalized(v: torch.Tensor, p: float) -> torch.Tensor:
    """``v`` divided per sample by its l_p norm; an all-zero sample stays zero (no NaN)."""
    size = torch.linalg.vector_norm(v.flatten(1), ord=p, dim=1).clamp_min(1e-12)
    return v / per_sample(size, v)


def project_l1(delta: torch.Tensor, eps: float) -> torch.Tensor:
    """Euclidean projection of each sample onto the l1 ball (Duchi et al. 2008, sort-based)."""
    flat = delta.flatten(1)
    inside = flat.abs().sum(1) <= eps
    magnitudes, _ = flat.abs().sort(dim=1, descending=True)
    cumulative = magnitudes.cumsum(1)
    ranks = torch.arange(1, flat.shape[1] + 1, device=delta.device, dtype=delta.dtype)
    candidates = magnitudes - (cumulative - eps) / ranks > 0
    rho = candidates.float().cumsum(1).argmax(1, keepdim=True)  # last index where True
    theta = ((cumulative.gather(1, rho) - eps) / (rho + 1).to(delta.dtype)).clamp_min(0)
    shrunk = flat.sign() * (flat.abs() - theta).clamp_min(0)
    return torch.where(inside[:, None], flat, shrunk).view_as(delta)


def project_l2_box(
    v: torch.Tensor, x: torch.Tensor, eps: float, max_rounds: int = 12
) -> torch.Tensor:
    """Euclidean projection of each ``v`` onto ``{z : ||z - x||_2 <= eps} ∩ [0, 1]^d``.

    The KKT conditions give ``z(t) = clip(x + t d, 0, 1)``, ``d = v - x``, for one ``t`` in
    (0, 1]: coordinate i moves by ``min(t |d_i|, room_i)``, ``room_i`` being its distance
    to the box face it heads for, so ``||z(t) - x||^2`` grows piecewise quadratically in
    ``t``. From the shrink-first ``t = eps / ||d||`` each round solves for ``t`` as if the
    coordinates saturated so far were the only ones: that never overshoots (more
    coordinates can only saturate), so every round's point lies in the ball and the rounds
    climb to the exact ``t``, which they reach once no new coordinate saturates (one to three
    rounds for MNIST steps; the last round's point is kept if ``max_rounds`` runs out).
    Shrinking first and clipping after wastes the budget the clip removes; clipping first and
    shrinking after turns the step's direction.
    """
    d = (v - x).flatten(1)
    start = x.flatten(1)
    room = torch.where(d > 0, 1 - start, start)
    square = d.square()
    t = (eps / square.sum(1, keepdim=True).sqrt().clamp_min(1e-30)).clamp(max=1.0)
    for _ in range(max_rounds):
        saturated = t * d.abs() >= room
        done = torch.where(saturated, room.square(), 0).sum(1, keepdim=True)
        left = torch.where(saturated, 0, square).sum(1, keepdim=True)
        solved = ((eps**2 - done).clamp_min(0) / left.clamp_min(1e-30)).sqrt()
        step = torch.where(left > 0, solved, torch.ones_like(t)).clamp(max=1.0)
        if bool((step <= t).all()):
            break
        t = torch.maximum(t, step)
    z = (start + d * t).clamp(0, 1)
    # float rounding may leave the point a hair outside the ball: a radial shrink inside the
    # box, only there (a candidate already in both sets comes back bit for bit)
    norm = torch.linalg.vector_norm(z - start, dim=1, keepdim=True)
    shrunk = start + (z - start) * (eps / norm.clamp_min(1e-30))
    return torch.where(norm > eps, shrunk, z).view_as(v)


def within_l1(z: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """``z`` (in [0, 1]), where its float64 l1 distance to ``x`` is over ``eps`` replaced by
    ``x + delta * eps / size`` with each coordinate rounded towards ``x``: every coordinate
    then moves at most as far as the float64 one, whose sizes sum to eps. Samples inside
    come back bit for bit."""
    delta = z.double() - x.double()
    size = delta.flatten(1).abs().sum(1)
    over = size > eps
    if not bool(over.any()):
        return z
    scaled = delta * per_sample(torch.where(over, eps / size.clamp_min(1e-300), 1.0), delta)
    near = (x.double() + scaled).to(z.dtype)
    outward = (near.double() - x.double()).abs() > scaled.abs()
    near = torch.where(outward, torch.nextafter(near, x), near)
    return torch.where(per_sample(over, z), near, z)


class ThreatModel:
    """The l_p ball of radius eps around the clean input, intersected with [0, 1]."""

    norm: Norm

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError

    def contain(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        return self.project(x_adv, x, eps)

    def random_start(
        self, x: torch.Tensor, eps: float, generator: RandomSource, surface: bool = False
    ) -> torch.Tensor:
        raise NotImplementedError

    def ascent(self, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class LinfThreat(ThreatModel):
    norm = Norm.LINF

    @staticmethod
    def bounds(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-pixel lower and upper ends of the ball intersected with [0, 1]: computed once,
        every later projection is one clamp."""
        return (x - eps).clamp_min(0), (x + eps).clamp_max(1)

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        lower, upper = self.bounds(x, eps)
        return torch.clamp(x_adv, lower, upper)

    def contain(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        return self.contain_delta(x_adv - x, x, eps)

    @staticmethod
    def contain_delta(delta: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        """``x + delta`` with delta clipped to the ball, then to [0, 1] (for attacks that
        keep the perturbation itself as their state)."""
        return (x + delta.clamp(-eps, eps)).clamp(0.0, 1.0)

    def random_start(
        self, x: torch.Tensor, eps: float, generator: RandomSource, surface: bool = False
    ) -> torch.Tensor:
        """Uniform in the cube (Madry's PGD) or, with ``surface``, scaled so the largest
        coordinate sits on the cube's surface (APGD's start)."""
        noise = 2 * rand(generator, x.shape, x.device) - 1
        if surface:
            return (x + eps * normalized(noise, math.inf)).clamp(0, 1)
        return (x + noise * eps).clamp(0, 1)

    def ascent(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.sign()


class L2Threat(ThreatModel):
    norm = Norm.L2

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        """The attacks' step rule: clip to [0, 1], then scale ``x_adv - x`` onto the ball
        (a point of both sets, not the closest one; see the module docstring for why)."""
        delta = x_adv.clamp(0, 1) - x
        size = torch.linalg.vector_norm(delta.flatten(1), dim=1)
        factor = (eps / size.clamp_min(1e-12)).clamp(max=1.0)
        return (x + delta * per_sample(factor, delta)).clamp(0, 1)

    def contain(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        """The closest point of the ball intersected with [0, 1]: the radial shrink for a
        candidate inside the box (written as it always was, so stored results stay bit for
        bit), ``project_l2_box`` for one outside it."""
        delta = x_adv - x
        size = delta.flatten(1).norm(p=2, dim=1)
        factor = torch.where(size > eps, eps / size.clamp_min(1e-12), torch.ones_like(size))
        radial = (x + delta * per_sample(factor, delta)).clamp(0.0, 1.0)
        in_box = ((x_adv >= 0) & (x_adv <= 1)).flatten(1).all(1)
        if bool(in_box.all()):
            return radial
        return torch.where(per_sample(in_box, x), radial, project_l2_box(x_adv, x, eps))

    def random_start(
        self, x: torch.Tensor, eps: float, generator: RandomSource, surface: bool = False
    ) -> torch.Tensor:
        """A Gaussian direction with a radius uniform in [0, eps] (as torchattacks' PGD-l2),
        or exactly eps with ``surface`` (APGD's start). A start uniform in the ball's volume
        (radius eps * U^(1/d)) would sit on the sphere in any realistic dimension, and since
        the l2 projection only rescales, that noise keeps a large share of the budget: on the
        zoo MNIST model it costs PGD-l2 about 4 points of robust accuracy at eps = 2."""
        direction = normalized(randn(generator, x.shape, x.device), 2)
        if surface:
            return (x + eps * direction).clamp(0, 1)
        radius = eps * rand(generator, (len(x), 1), x.device)[:, 0]
        return (x + direction * per_sample(radius, x)).clamp(0, 1)

    def ascent(self, grad: torch.Tensor) -> torch.Tensor:
        return normalized(grad, 2)


class L1Threat(ThreatModel):
    norm = Norm.L1

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        return (x + project_l1(x_adv - x, eps)).clamp(0.0, 1.0)

    def contain(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        """The step projection, made exact: each changed pixel of ``x + delta`` rounds by up
        to half a unit in the last place, outwards as often as not, and over many pixels
        that adds up (0.47% of eps at eps 0.001 on 784 pixels); a sample still over eps in
        float64 is scaled onto the sphere in float64 and rounded towards ``x``."""
        return within_l1(self.project(x_adv, x, eps), x, eps)

    def random_start(
        self, x: torch.Tensor, eps: float, generator: RandomSource, surface: bool = False
    ) -> torch.Tensor:
        """A uniform direction on the l1 sphere (Laplace noise, normalised) and a radius
        uniform in [0, eps] (exactly eps with ``surface``)."""
        exponential = -rand(generator, x.shape, x.device).log()
        signs = randint(generator, 0, 2, x.shape, x.device) * 2 - 1
        if surface:
            radius = torch.full((len(x),), eps, device=x.device)
        else:
            radius = eps * rand(generator, (len(x), 1), x.device)[:, 0]
        direction = normalized(exponential * signs, 1)
        return (x + direction * per_sample(radius, x)).clamp(0, 1)

    def ascent(self, grad: torch.Tensor) -> torch.Tensor:
        """Plain l1 steepest ascent moves one coordinate; attacks under l1 use a sparser
        rule of their own (SLIDE's top-percentile signs, ``pgd_l1.sparse_direction``)."""
        return normalized(grad, 1)


THREATS: dict[Norm, ThreatModel] = {
    Norm.LINF: LinfThreat(),
    Norm.L2: L2Threat(),
    Norm.L1: L1Threat(),
}


def threat_model(norm: Norm) -> ThreatModel:
    return THREATS[norm]
