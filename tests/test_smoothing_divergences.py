"""The f-divergence (KL) and Rényi certificates against hand-computed values, closed forms,
a 50-digit reference, and the ordering the literature proves (Neyman-Pearson above both)."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch
from scipy.special import lambertw
from test_smoothing_certify import threshold_model  # the one-coordinate threshold model

from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.defense.smoothing.bounds import dp_radius
from aisafety.defense.smoothing.certify import (
    Bound,
    certificates,
    certify,
    estimate,
)
from aisafety.defense.smoothing.divergences import (
    kl_radius,
    laplace_renyi,
    renyi_budget,
    renyi_radius,
)
from aisafety.defense.smoothing.noise import Noise, certified_radius
from aisafety.errors import ConfigError

# p_A from 1/2 to 1 - 1e-12, linearly and towards 1 (where the bounds differ the most).
P_A = np.concatenate([np.linspace(0.5, 1, 201)[1:-1], 1 - np.logspace(-12, -1, 100)])


def test_kl_radius_hand_computed():
    """p_A = 0.9: 4 p_A p_B = 0.36, so the Gaussian radius is sigma sqrt(-ln 0.36)."""
    got = kl_radius(Noise.GAUSSIAN, 0.5, np.array([0.9, 0.5, 0.3]))
    assert got[0] == pytest.approx(0.5 * 1.0107676525947897, rel=1e-12)
    assert got[0] == pytest.approx(0.5 * math.sqrt(-math.log(0.36)), rel=1e-12)
    assert got[1] == 0.0 and got[2] == 0.0


@pytest.mark.parametrize("b", [0.25, 1.0])
def test_laplace_kl_radius_is_the_lambert_w_closed_form(b):
    """t/b + e^{-t/b} - 1 = kl(1/2 || p_A) has the root t/b = c + W_0(-e^{-c}), c = 1 + kl;
    the bisection lands on it from below."""
    p = P_A[P_A < 1 - 1e-9]
    kl = -0.5 * np.log(4 * p * (1 - p))
    c = 1 + kl
    closed = b * (c + np.real(lambertw(-np.exp(-c))))
    got = kl_radius(Noise.LAPLACE, b, p)
    far = closed > 1e-3 * b  # W_0 loses digits at its branch point (small radii)
    assert np.allclose(got[far], closed[far], rtol=1e-9, atol=0)
    assert np.all(got / b + np.expm1(-got / b) <= kl + 1e-15)


def test_renyi_hand_computed_at_alpha_2_and_1():
    """For two answers, 2 M_{-1}(p, q) = 4 p q (the harmonic mean) and 2 M_0 = 2 sqrt(p q):
    Rényi's Gaussian radius at alpha = 2 and as alpha -> 1 are both the KL radius."""
    budget = renyi_budget(np.array([0.9]), np.array([2.0, 1.0 + 1e-9]))[0]
    assert budget[0] == pytest.approx(-math.log(0.36), rel=1e-12)
    assert budget[1] == pytest.approx(-0.5 * math.log(0.36), rel=1e-6)
    radius_at_2 = math.sqrt(2 * 1.0**2 / 2 * budget[0])
    assert radius_at_2 == pytest.approx(kl_radius(Noise.GAUSSIAN, 1.0, np.array([0.9]))[0])
    assert renyi_radius(Noise.GAUSSIAN, 1.0, np.array([0.9]))[0] >= radius_at_2 * (1 - 2e-9)


def _mp_budget(p: float, a: mp.mpf) -> mp.mpf:
    P = mp.mpf(p)
    s = 1 - a
    return -mp.log(2 * ((P**s + (1 - P) ** s) / 2) ** (1 / s))


def _mp_laplace(t: mp.mpf, a: mp.mpf) -> mp.mpf:
    return mp.log(
        a / (2 * a - 1) * mp.e ** ((a - 1) * t) + (a - 1) / (2 * a - 1) * mp.e ** (-a * t)
    ) / (a - 1)


@pytest.mark.parametrize("p", [0.500025, 0.6, 0.9, 0.999, 1 - 1e-7])
def test_renyi_against_a_50_digit_reference(p):
    """At every 40th alpha of our grid the radius is computed in 50-digit arithmetic
    (Gaussian: closed form; Laplace: the root of D_alpha(t) = budget); ours is at least the
    best of them and at most the Neyman-Pearson radius. Off the grid (Gaussian, 2,000
    alphas) the supremum is above ours by under 1e-6: what the grid gives away."""
    mp.mp.dps = 50
    gauss, laplace = mp.mpf(0), mp.mpf(0)
    for a in (mp.mpf(1) + mp.mpf(10) ** e for e in np.linspace(-4, 4, 1601)[::40]):
        budget = _mp_budget(p, a)
        gauss = max(gauss, mp.sqrt(2 / a * budget))
        hi = mp.mpf(1)
        while _mp_laplace(hi, a) < budget:
            hi *= 2
        lo = mp.mpf(0)
        for _ in range(120):  # bisection: D_alpha increases with t
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _mp_laplace(mid, a) < budget else (lo, mid)
        laplace = max(laplace, lo)
    got = {
        noise: renyi_radius(noise, 1.0, np.array([p]))[0]
        for noise in (Noise.GAUSSIAN, Noise.LAPLACE)
    }
    assert got[Noise.GAUSSIAN] >= float(gauss) * (1 - 2e-9)
    assert got[Noise.LAPLACE] >= float(laplace) * (1 - 2e-9)
    exponents = np.linspace(-4, 4, 2000)
    finer = max(
        mp.sqrt(2 / (1 + mp.mpf(10) ** e) * _mp_budget(p, 1 + mp.mpf(10) ** e)) for e in exponents
    )
    assert got[Noise.GAUSSIAN] >= float(finer) * (1 - 1e-6)
    for noise, radius in got.items():
        assert radius <= certified_radius(noise, 1.0, np.array([p]))[0]


def test_laplace_renyi_is_convex_in_the_shift():
    """The l1 argument: D_alpha is additive over coordinates, and convex with D(0) = 0 in each
    shift, so one coordinate carrying all of ||delta||_1 is the worst case."""
    t = np.linspace(0, 5, 2001)[:, None]
    alphas = 1 + np.logspace(-3, 3, 13)
    d = laplace_renyi(t, 1.0, alphas)
    assert np.all(d[0] == 0)
    assert np.all(np.diff(d, 2, axis=0) >= -1e-12)
    # and at alpha -> infinity it tends to t/b, the largest log density ratio
    assert np.allclose(laplace_renyi(t, 1.0, np.array([1e8])), t, atol=1e-6)


@pytest.mark.parametrize(("noise", "sigma"), [(Noise.GAUSSIAN, 0.5), (Noise.LAPLACE, 0.7)])
def test_proved_ordering_on_every_p_a(noise, sigma):
    """Neyman-Pearson is the largest radius any certificate from p_A alone can give, so it
    is at least Rényi's, KL's and PixelDP's at every p_A; Rényi's supremum includes
    alpha -> 1, where it is KL's."""
    np_radius = certified_radius(noise, sigma, P_A)
    renyi = renyi_radius(noise, sigma, P_A)
    kl = kl_radius(noise, sigma, P_A)
    dp = dp_radius(noise, sigma, P_A)
    assert np.all(renyi <= np_radius) and np.all(kl <= np_radius) and np.all(dp <= np_radius)
    assert np.all(renyi >= kl * (1 - 2e-9))
    assert np.all(kl > 0) and np.all(np.isfinite(renyi))
    for bound in (renyi_radius, kl_radius):
        assert bound(noise, sigma, np.array([0.5, 0.4]))[0] == 0.0
        assert bound(noise, sigma, np.array([1.0]))[0] == np.inf


def test_every_bound_from_one_estimate():
    """``estimate`` draws once; each bound's certificates share its answers and p_A, and
    ``certify`` with a bound gives the same as certificates of an estimate with that seed."""
    smoothed = RandomizedSmoothing(threshold_model(0.2), {"noise": "gaussian", "sigma": 0.5})
    x = torch.tensor([[[[0.9, 0.1]]], [[[0.3, 0.0]]], [[[0.2, 0.5]]]])
    est = estimate(smoothed, x, 20, 500, 0.001)
    certs = {bound: certificates(est, bound) for bound in Bound}
    base = certs[Bound.NEYMAN_PEARSON]
    for bound, cert in certs.items():
        assert np.array_equal(cert.prediction, base.prediction)
        assert np.array_equal(cert.p_a_lower, base.p_a_lower)
        assert np.all(cert.radius <= base.radius)
        again = certify(
            RandomizedSmoothing(threshold_model(0.2), {"noise": "gaussian", "sigma": 0.5}),
            x,
            20,
            500,
            0.001,
            bound=bound,
        )
        assert np.array_equal(again.radius, cert.radius)
    assert certs[Bound.RENYI].radius[0] > 0


def test_no_divergence_bound_for_uniform_noise():
    smoothed = RandomizedSmoothing(threshold_model(0.2), {"noise": "uniform"})
    x = torch.tensor([[[[0.5, 0.5]]]])
    for bound in (Bound.F_DIVERGENCE, Bound.RENYI):
        with pytest.raises(ConfigError, match=f"the {bound.value} bound .* not uniform"):
            certify(smoothed, x, 10, 100, 0.001, bound=bound)
