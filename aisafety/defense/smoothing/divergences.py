"""Divergence certificates: Rényi (Li et al. 2019) and the f-divergence framework's KL bound
(Dvijotham et al. 2020), for Gaussian (l2) and Laplace (l1) noise.

Both bound how far the distribution of the base classifier's answers can move when the
input moves by delta, and certify when that is too little to make the runner-up win.
With p_B = 1 - p_A (as CERTIFY takes it):

- Rényi (Li et al., Lemma 1 and Theorem 2): the top answer cannot change while
  D_alpha(noise + delta || noise) < -log(2 M_{1-alpha}(p_A, p_B)) for some alpha > 1, where
  M_s(a, b) = ((a^s + b^s) / 2)^(1/s) is the generalised mean. Gaussian noise:
  D_alpha = alpha ||delta||_2^2 / (2 sigma^2), so r^2 = sup_alpha 2 sigma^2 / alpha
  * (-log(2 M_{1-alpha})). Laplace noise (scale b, l1): D_alpha is additive over coordinates
  and convex in each |delta_i| with value 0 at 0, so it is largest with all of ||delta||_1
  on one coordinate: D_alpha(t) = log(alpha/(2 alpha - 1) e^{(alpha-1) t/b}
  + (alpha-1)/(2 alpha - 1) e^{-alpha t/b}) / (alpha - 1). The supremum is taken over a grid
  of alpha: each alpha gives a valid certificate, so the grid's maximum is one too.
- KL (Dvijotham et al.: one KL constraint, the information p_A >= p): by data processing on
  the event {answer = A}, the smallest probability of A within KL(nu || rho) <= eps is the q
  with kl(q || p_A) = eps, so A stays on top while eps < kl(1/2 || p_A)
  = -log(4 p_A p_B) / 2. Gaussian: eps = ||delta||^2 / (2 sigma^2), so
  r = sigma sqrt(-log(4 p_A p_B)). Laplace (l1, the same one-coordinate argument):
  eps = t/b + e^{-t/b} - 1, solved by bisection (the closed form
  t/b = c + W_0(-e^{-c}), c = 1 + kl(1/2 || p_A), is the test's reference: Lambert W loses
  precision near its branch point, bisection keeps the lower end).

For binary answers the KL radius is also Rényi's at alpha -> 1 and, for Gaussian noise, at
alpha = 2 (2 M_{-1} = 4 p_A p_B), so Rényi's supremum is never below it. Neither reaches the
Neyman-Pearson radius, which is the largest any certificate from p_A alone can give.
Uniform noise has no certificate here: shifting it moves mass outside its support, so
both divergences are infinite.
"""

from __future__ import annotations

import numpy as np

from aisafety.defense.smoothing.noise import Noise

# alpha - 1 over eight decades, log-spaced: the best alpha grows as p_B shrinks.
_ALPHAS = 1.0 + np.logspace(-4, 4, 1601)
_BISECTIONS = 60
# Rényi's radius is scaled by 1 - this: the budget and divergence are accurate to about
# 1e-12 relative, and the radius is the root where two of them meet.
_ROUNDING = 1e-9
# p_A values per pass: a (256, 1601) float64 array is 3.3 MB, a pass holds a few dozen
_CHUNK = 256


def _clipped(p_a: np.ndarray) -> np.ndarray:
    return np.clip(np.asarray(p_a, dtype=np.float64), 0.5, 1.0)


def _unsupported(noise: Noise, name: str) -> ValueError:
    return ValueError(
        f"the {name} bound is defined for gaussian (l2) and laplace (l1) noise, not {noise.value!r}"
    )


def _phi(x: np.ndarray) -> np.ndarray:
    """e^x - 1 - x without cancellation (its Taylor series where |x| is small)."""
    small = np.abs(x) < 1e-2
    xs = np.where(small, x, 0.0)
    series = xs**2 * (1 / 2 + xs * (1 / 6 + xs * (1 / 24 + xs * (1 / 120 + xs / 720))))
    with np.errstate(over="ignore"):
        return np.where(small, series, np.expm1(x) - x)


def _log_mix(w1, x1, w2, x2, linear) -> np.ndarray:
    """log(w1 e^x1 + w2 e^x2) for w1 + w2 = 1, given linear = w1 x1 + w2 x2 computed
    accurately by the caller: near 0 the two exponentials cancel to first order, so the sum
    is rebuilt from that term and the (positive) remainders; far from 0, in log space."""
    near = np.maximum(np.abs(x1), np.abs(x2)) <= 1.0
    with np.errstate(over="ignore"):
        close = np.log1p(
            linear + w1 * _phi(np.where(near, x1, 0.0)) + w2 * _phi(np.where(near, x2, 0.0))
        )
    far = np.logaddexp(np.log(w1) + x1, np.log(w2) + x2)
    return np.where(near, close, far)


def renyi_budget(p_a: np.ndarray, alphas: np.ndarray = _ALPHAS) -> np.ndarray:
    """-log(2 M_{1-alpha}(p_A, 1 - p_A)) for each p_A (rows) and alpha (columns): the Rényi
    divergence the top answer survives. With d = p_A - 1/2 (exact in floating point) it is
    log(((1 + 2d)^s + (1 - 2d)^s) / 2) / (alpha - 1), s = 1 - alpha, whose two powers
    nearly cancel when d or s is small; ``_log_mix`` keeps the difference."""
    d = (_clipped(p_a) - 0.5)[..., None]
    s = 1.0 - alphas
    with np.errstate(divide="ignore", invalid="ignore"):
        u, v = s * np.log1p(2 * d), s * np.log1p(-2 * d)
        linear = s * np.log1p(-4 * d * d) / 2
    u, v, linear = np.broadcast_arrays(u, v, linear)
    budget = _log_mix(0.5, u, 0.5, v, linear) / (alphas - 1)
    return np.maximum(budget, 0.0)


def laplace_renyi(t: np.ndarray, b: float, alpha: np.ndarray) -> np.ndarray:
    """D_alpha(Laplace(t, b) || Laplace(0, b)) in one dimension (Li et al., Table 1):
    log(alpha/(2 alpha-1) e^{(alpha-1) t/b} + (alpha-1)/(2 alpha-1) e^{-alpha t/b})
    / (alpha - 1); the weighted exponents sum to 0 exactly."""
    a = alpha
    x1, x2 = (a - 1) * t / b, -a * t / b
    w1, w2 = a / (2 * a - 1), (a - 1) / (2 * a - 1)
    x1, x2, w1, w2 = np.broadcast_arrays(x1, x2, w1, w2)
    return _log_mix(w1, x1, w2, x2, np.zeros_like(x1)) / (a - 1)


def renyi_radius(noise: Noise, sigma: float, p_a: np.ndarray) -> np.ndarray:
    """Li et al.'s certified radius (l2 for Gaussian, l1 for Laplace); 0 where p_a <= 1/2.
    Computed ``_CHUNK`` values of p_A at a time: each holds (values, alphas) arrays."""
    if noise not in (Noise.GAUSSIAN, Noise.LAPLACE):
        raise _unsupported(noise, "Rényi")
    p = np.asarray(p_a, dtype=np.float64)
    flat = p.reshape(-1)
    parts = [_renyi_chunk(noise, sigma, flat[i : i + _CHUNK]) for i in range(0, len(flat), _CHUNK)]
    radius = np.concatenate(parts) if parts else np.zeros(0)
    return radius.reshape(p.shape) * (1 - _ROUNDING)


def _renyi_chunk(noise: Noise, sigma: float, p_a: np.ndarray) -> np.ndarray:
    budget = renyi_budget(p_a)  # (values, alphas)
    if noise is Noise.GAUSSIAN:
        return np.sqrt(2 * sigma**2 / _ALPHAS * budget).max(axis=-1)
    return _largest_below(lambda t: laplace_renyi(t, sigma, _ALPHAS), budget, sigma)


def _largest_below(divergence, budget: np.ndarray, scale: float) -> np.ndarray:
    """max over the last axis of the largest t with divergence(t) < budget, by bisection on
    each (divergence increases with t); the lower end is kept, so never above the root.
    An infinite budget (p_A = 1) gives an infinite radius, as Neyman-Pearson's does."""
    infinite = np.isinf(budget)
    budget = np.where(infinite, 0.0, budget)
    lo = np.zeros_like(budget)
    hi = np.full_like(budget, scale)
    while True:  # grow hi until it is past the root everywhere
        over = divergence(hi) < budget
        if not over.any():
            break
        hi = np.where(over, 2 * hi, hi)
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        inside = divergence(mid) < budget
        lo, hi = np.where(inside, mid, lo), np.where(inside, hi, mid)
    return np.where(infinite, np.inf, lo).max(axis=-1)


def kl_budget(p_a: np.ndarray) -> np.ndarray:
    """kl(1/2 || p_A) = -log(4 p_A (1 - p_A)) / 2: the KL divergence the top answer survives."""
    p = _clipped(p_a)
    with np.errstate(divide="ignore"):
        return np.maximum(-0.5 * (np.log(4 * p) + np.log1p(-p)), 0.0)


def laplace_kl(t: np.ndarray, b: float) -> np.ndarray:
    """KL(Laplace(t, b) || Laplace(0, b)) in one dimension: t/b + e^{-t/b} - 1."""
    return t / b + np.expm1(-t / b)


def kl_radius(noise: Noise, sigma: float, p_a: np.ndarray) -> np.ndarray:
    """The f-divergence framework's KL radius (l2 for Gaussian, l1 for Laplace)."""
    budget = kl_budget(p_a)
    if noise is Noise.GAUSSIAN:
        return sigma * np.sqrt(2 * budget)
    if noise is Noise.LAPLACE:
        return _largest_below(lambda t: laplace_kl(t, sigma), budget[..., None], sigma)
    raise _unsupported(noise, "f-divergence (KL)")
