"""Confidence bounds on the top class's probability, and the PixelDP baseline radius.

``clopper_pearson_lower`` is CERTIFY's one-sided (1 - alpha) lower bound on p_A from
n_A successes in n draws: the alpha quantile of Beta(n_A, n - n_A + 1), which is what
``statsmodels``' ``proportion_confint(n_A, n, 2 alpha, method="beta")[0]`` returns in Cohen
et al.'s code.

``dp_radius`` is the differential-privacy certificate of Lecuyer et al. (2019, PixelDP), the
baseline the SoK compares Neyman-Pearson with. A mechanism that is (eps, delta)-DP for
perturbations of size L keeps expected scores within exp(eps) of each other, so the top class
is robust at L when p_A > exp(2 eps) p_B + (1 + exp(eps)) delta (their Proposition 1), with
p_B = 1 - p_A as in CERTIFY. Laplace noise of scale b is (L / b, 0)-DP in l1, giving
L = b/2 log(p_A / p_B); Gaussian noise of std sigma is (eps, delta)-DP in l2 for
L = sigma eps / sqrt(2 log(1.25 / delta)) when eps <= 1 (Dwork & Roth, Theorem A.1), and the
radius is the largest L over a grid of (eps, delta).
"""

from __future__ import annotations

import numpy as np

from aisafety.defense.smoothing.noise import Noise

_DP_EPS = np.linspace(1e-3, 1.0, 1000)
_DP_DELTA = np.logspace(-15, -1, 57)


def clopper_pearson_lower(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided (1 - alpha) lower confidence bound on a binomial proportion (0 where k = 0)."""
    from scipy.stats import beta  # here: scipy.stats takes ~0.7 s to import

    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bound = beta.ppf(alpha, k, trials - k + 1)
    return np.where(k > 0, bound, 0.0)


def dp_radius(noise: Noise, sigma: float, p_a: np.ndarray) -> np.ndarray:
    """PixelDP's certified radius (l1 for Laplace, l2 for Gaussian); 0 where p_a <= 1/2."""
    p = np.clip(np.asarray(p_a, dtype=np.float64), 0.5, 1.0)
    if noise is Noise.LAPLACE:
        with np.errstate(divide="ignore"):
            return np.maximum(sigma / 2 * np.log(p / (1 - p)), 0.0)
    if noise is Noise.GAUSSIAN:
        eps, delta = _DP_EPS[:, None], _DP_DELTA[None, :]
        radius = sigma * eps / np.sqrt(2 * np.log(1.25 / delta))  # (E, D)
        needed = np.exp(2 * eps) * (1 - p[..., None, None]) + (1 + np.exp(eps)) * delta
        robust = p[..., None, None] > needed
        return np.where(robust, radius, 0.0).max(axis=(-2, -1))
    raise ValueError(
        f"the differential-privacy bound is defined for gaussian (l2) and laplace (l1) noise, "
        f"not {noise.value!r}"
    )
