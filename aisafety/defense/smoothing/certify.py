"""CERTIFY (Cohen, Rosenfeld & Kolter 2019, Algorithm 1 and ``locuslab/smoothing``'s core.py).

For each image: draw ``n0`` noisy copies and take the base model's most frequent answer c_A
(selection); draw ``n`` fresh copies and count the votes n_A for c_A (estimation); bound
p_A from below by the one-sided Clopper-Pearson bound at level ``alpha``; abstain when the
bound is below 1/2, else certify the radius the chosen bound gives for the noise
(``Bound``). ``estimate`` draws the votes once; ``certificates`` turns one estimate into any
bound's radii, so every bound of a comparison sees the same Monte-Carlo samples. With
probability at least 1 - alpha over the draws, a non-abstaining answer is the smoothed
classifier's answer everywhere within the radius.

Votes come from ``RandomizedSmoothing.votes``: the draws of all images in a chunk share
each forward pass, so small ``n`` still fills the batch. Per-image seconds are the chunk's
time divided by its images (one image per chunk once ``n >= batch_size``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from aisafety.defense.randomized_smoothing import ABSTAIN, RandomizedSmoothing
from aisafety.defense.smoothing.bounds import clopper_pearson_lower, dp_radius
from aisafety.defense.smoothing.divergences import kl_radius, renyi_radius
from aisafety.defense.smoothing.noise import CERTIFIED_NORM, Noise, certified_radius
from aisafety.errors import ConfigError


class Bound(StrEnum):
    """The certificate drawn from p_A: Neyman-Pearson (the tightest from p_A alone), and the
    PixelDP, f-divergence (KL) and Rényi bounds the SoK compares it with."""

    NEYMAN_PEARSON = "neyman-pearson"
    DIFFERENTIAL_PRIVACY = "differential-privacy"
    F_DIVERGENCE = "f-divergence"
    RENYI = "renyi"


RADIUS = {
    Bound.NEYMAN_PEARSON: certified_radius,
    Bound.DIFFERENTIAL_PRIVACY: dp_radius,
    Bound.F_DIVERGENCE: kl_radius,
    Bound.RENYI: renyi_radius,
}
# The noises each bound is defined for (uniform noise has infinite divergences and no DP).
BOUND_NOISES = {
    Bound.NEYMAN_PEARSON: frozenset(Noise),
    Bound.DIFFERENTIAL_PRIVACY: frozenset({Noise.GAUSSIAN, Noise.LAPLACE}),
    Bound.F_DIVERGENCE: frozenset({Noise.GAUSSIAN, Noise.LAPLACE}),
    Bound.RENYI: frozenset({Noise.GAUSSIAN, Noise.LAPLACE}),
}


@dataclass(frozen=True)
class Estimate:
    """CERTIFY's Monte-Carlo part, per image: the selected class, the p_A lower bound and the
    seconds spent; with the noise, its scale and the input size every bound needs."""

    guess: np.ndarray
    p_a_lower: np.ndarray
    seconds: np.ndarray
    noise: Noise
    sigma: float
    dimension: int


@dataclass(frozen=True)
class Certificates:
    """Per image: the certified answer (ABSTAIN = -1), the p_A lower bound, the radius in
    ``norm`` (0 when abstaining) and the seconds spent."""

    prediction: np.ndarray
    p_a_lower: np.ndarray
    radius: np.ndarray
    seconds: np.ndarray
    norm: str

    @property
    def abstained(self) -> np.ndarray:
        return self.prediction == ABSTAIN

    def certified_correct(self, y: np.ndarray, radius: float) -> np.ndarray:
        """True where the answer is the label and the certified radius reaches ``radius``
        (Cohen et al.'s ``approximate certified accuracy``)."""
        return (self.prediction == np.asarray(y)) & (self.radius >= radius)


def certified_norms(noise: Noise) -> tuple[str, ...]:
    """The norms a noise certifies: its own, plus l-inf through l2 / sqrt(d) for Gaussian
    noise (the SoK's conversion: ||delta||_2 <= sqrt(d) ||delta||_inf)."""
    native = CERTIFIED_NORM[noise]
    return (native, "linf") if native == "l2" else (native,)


def check_setting(noise: Noise, norm: str, bound: Bound) -> None:
    """Refuse a norm the noise does not certify, or a bound the noise has none of."""
    if norm not in certified_norms(noise):
        raise ConfigError(
            f"{noise.value} smoothing certifies {' and '.join(certified_norms(noise))} radii, "
            f"not {norm!r}; pick one of those norms or another noise"
        )
    if noise not in BOUND_NOISES[bound]:
        noises = " and ".join(sorted(n.value for n in BOUND_NOISES[bound]))
        raise ConfigError(
            f"the {bound.value} bound is defined for {noises} noise, not {noise.value}; "
            "use bound 'neyman-pearson' or another noise"
        )


def estimate(
    smoothed: RandomizedSmoothing, x: torch.Tensor, n0: int, n: int, alpha: float
) -> Estimate:
    """Selection and estimation draws for every image of ``x`` (the defense's noise, seed and
    batch size), and the Clopper-Pearson lower bound on p_A."""
    if n0 < 1 or n < 1 or not 0 < alpha < 1:
        raise ConfigError(
            f"CERTIFY needs n0 >= 1, n >= 1 and 0 < alpha < 1, got n0={n0}, n={n}, alpha={alpha}"
        )
    smoothed.check_input(x)
    chunk = max(1, smoothed.config.batch_size // min(n, smoothed.config.batch_size))
    top, n_top, seconds = [], [], []
    for part in x.split(chunk):
        started = time.perf_counter()
        guess = smoothed.votes(part, n0).argmax(1)
        counts = smoothed.votes(part, n)
        top.append(guess)
        n_top.append(counts.gather(1, guess[:, None])[:, 0])
        seconds += [(time.perf_counter() - started) / len(part)] * len(part)
    return Estimate(
        guess=torch.cat(top).cpu().numpy(),
        p_a_lower=clopper_pearson_lower(torch.cat(n_top).cpu().numpy(), n, alpha),
        seconds=np.asarray(seconds),
        noise=smoothed.config.noise,
        sigma=smoothed.config.sigma,
        dimension=math.prod(x.shape[1:]),
    )


def certificates(est: Estimate, bound: Bound, norm: str | None = None) -> Certificates:
    """The certificates ``bound`` gives from one estimate (abstaining where p_A < 1/2)."""
    norm = norm or CERTIFIED_NORM[est.noise]
    check_setting(est.noise, norm, bound)
    radius = RADIUS[bound](est.noise, est.sigma, est.p_a_lower)
    if norm == "linf":
        radius = radius / math.sqrt(est.dimension)
    abstain = est.p_a_lower < 0.5
    return Certificates(
        prediction=np.where(abstain, ABSTAIN, est.guess),
        p_a_lower=est.p_a_lower,
        radius=np.where(abstain, 0.0, radius),
        seconds=est.seconds,
        norm=norm,
    )


def bounds_for(noise: Noise) -> list[Bound]:
    """Every bound defined for ``noise``, in ``Bound``'s order."""
    return [bound for bound in Bound if noise in BOUND_NOISES[bound]]


def certify_every_bound(est: Estimate, norm: str | None = None) -> dict[Bound, Certificates]:
    """Each bound's certificates from the one estimate (the same draws for all)."""
    return {bound: certificates(est, bound, norm) for bound in bounds_for(est.noise)}


def certify(
    smoothed: RandomizedSmoothing,
    x: torch.Tensor,
    n0: int,
    n: int,
    alpha: float,
    norm: str | None = None,
    bound: Bound = Bound.NEYMAN_PEARSON,
) -> Certificates:
    """CERTIFY every image of ``x`` with ``smoothed``'s noise, seed and batch size."""
    check_setting(smoothed.config.noise, norm or CERTIFIED_NORM[smoothed.config.noise], bound)
    return certificates(estimate(smoothed, x, n0, n, alpha), bound, norm)
