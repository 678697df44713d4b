"""CERTIFY (Cohen, Rosenfeld & Kolter 2019, Algorithm 1 and ``locuslab/smoothing``'s core.py).

For each image: draw ``n0`` noisy copies and take the base model's most frequent answer c_A
(selection); draw ``n`` fresh copies and count the votes n_A for c_A (estimation); bound
p_A from below by the one-sided Clopper-Pearson bound at level ``alpha``; abstain when the
bound is below 1/2, else certify the radius the noise gives (``noise.certified_radius``, or
the differential-privacy baseline). With probability at least 1 - alpha over the draws, a
non-abstaining answer is the smoothed classifier's answer everywhere within the radius.

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
from aisafety.defense.smoothing.noise import CERTIFIED_NORM, Noise, certified_radius
from aisafety.errors import ConfigError


class Bound(StrEnum):
    NEYMAN_PEARSON = "neyman-pearson"
    DIFFERENTIAL_PRIVACY = "differential-privacy"


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
    noise, sigma = smoothed.config.noise, smoothed.config.sigma
    norm = norm or CERTIFIED_NORM[noise]
    if norm not in certified_norms(noise):
        raise ConfigError(
            f"{noise.value} smoothing certifies {' and '.join(certified_norms(noise))} radii, "
            f"not {norm!r}; pick one of those norms or another noise"
        )
    if bound is Bound.DIFFERENTIAL_PRIVACY and noise is Noise.UNIFORM:
        raise ConfigError(
            "the differential-privacy bound is defined for gaussian and laplace noise, not "
            "uniform; use bound 'neyman-pearson' or another noise"
        )
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
    guess = torch.cat(top).cpu().numpy()
    p_a = clopper_pearson_lower(torch.cat(n_top).cpu().numpy(), n, alpha)
    if bound is Bound.NEYMAN_PEARSON:
        radius = certified_radius(noise, sigma, p_a)
    else:
        radius = dp_radius(noise, sigma, p_a)
    if norm == "linf":
        radius = radius / math.sqrt(math.prod(x.shape[1:]))
    abstain = p_a < 0.5
    return Certificates(
        prediction=np.where(abstain, ABSTAIN, guess),
        p_a_lower=p_a,
        radius=np.where(abstain, 0.0, radius),
        seconds=np.asarray(seconds),
        norm=norm,
    )
