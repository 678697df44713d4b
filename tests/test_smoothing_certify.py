"""CERTIFY against closed forms, scipy's exact binomial interval and an EOT attack."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binom, binomtest, norm
from torch import nn

from aisafety.attack.pgd_l2 import PGDL2
from aisafety.database.zoo import load_zoo_model
from aisafety.defense.randomized_smoothing import ABSTAIN, RandomizedSmoothing
from aisafety.defense.smoothing.bounds import clopper_pearson_lower, dp_radius
from aisafety.defense.smoothing.certify import Bound, certify
from aisafety.defense.smoothing.noise import Noise, certified_radius
from aisafety.errors import ConfigError
from aisafety.prediction.torch_module import TorchPredictor

CASES = [(1, 10), (5, 10), (9, 10), (10, 10), (73, 100), (99_000, 100_000), (100_000, 100_000)]


@pytest.mark.parametrize("alpha", [0.001, 0.05])
def test_clopper_pearson_equals_scipy_exact_interval(alpha):
    """The one-sided 1 - alpha bound is the lower end of the two-sided 1 - 2 alpha exact
    (Clopper-Pearson) interval, which scipy's binomtest computes by root finding."""
    for successes, trials in CASES:
        got = clopper_pearson_lower(np.array([successes]), trials, alpha)[0]
        ci = binomtest(successes, trials).proportion_ci(1 - 2 * alpha, method="exact")
        assert abs(got - ci.low) < 1e-9
        # Definition: P(Binomial(n, p) >= k) = alpha at p = the bound.
        if successes < trials:
            tail = partial(binom.sf, successes - 1, trials)
            root = brentq(lambda p, tail=tail: tail(p) - alpha, 1e-12, 1 - 1e-12, xtol=1e-14)
            assert abs(got - root) < 1e-9
    assert clopper_pearson_lower(np.array([0]), 10, alpha)[0] == 0.0


def threshold_model(threshold: float) -> TorchPredictor:
    """Class 1 iff x[0] > threshold on a (1, 1, 2) input: the l1 and l2 distance of x to
    the boundary is |x[0] - threshold|."""
    layer = nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
        layer.bias.copy_(torch.tensor([0.0, -threshold]))
    return TorchPredictor(nn.Sequential(nn.Flatten(), layer), (1, 1, 2), 2)


@pytest.mark.parametrize(
    ("noise", "sigma"), [(Noise.GAUSSIAN, 0.5), (Noise.LAPLACE, 0.3), (Noise.UNIFORM, 0.6)]
)
def test_radius_converges_to_the_exact_distance_for_a_linear_model(noise, sigma):
    """For a threshold on one coordinate p_A is known exactly and each noise's radius at
    that p_A is the true distance m to the boundary (Gaussian: sigma Phi^-1(Phi(m/sigma));
    Laplace: -b log(2 * exp(-m/b)/2); uniform: 2 lambda ((lambda + m)/(2 lambda) - 1/2)).
    CERTIFY's radius stays below m and closes in on it as n grows."""
    margin = 0.3
    base = threshold_model(0.2)
    x = torch.tensor([[[[0.2 + margin, 0.5]]]])
    exact_p = {
        Noise.GAUSSIAN: norm.cdf(margin / sigma),
        Noise.LAPLACE: 1 - 0.5 * math.exp(-margin / sigma),
        Noise.UNIFORM: (sigma + margin) / (2 * sigma),
    }[noise]
    assert certified_radius(noise, sigma, np.array([exact_p]))[0] == pytest.approx(margin)
    errors = []
    for n in (1_000, 10_000, 100_000, 1_000_000):
        smoothed = RandomizedSmoothing(
            base, {"noise": noise.value, "sigma": sigma, "batch_size": 200_000, "seed": n}
        )
        cert = certify(smoothed, x, n0=100, n=n, alpha=0.001)
        assert cert.prediction[0] == 1
        assert cert.radius[0] <= margin
        errors.append(margin - cert.radius[0])
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < 0.01


def test_linf_is_the_l2_radius_over_sqrt_d_and_abstention():
    base = threshold_model(0.2)
    x = torch.tensor([[[[0.5, 0.5]]], [[[0.2, 0.5]]]])  # the second sits on the boundary
    smoothed = RandomizedSmoothing(base, {"sigma": 0.5, "batch_size": 20_000, "seed": 1})
    l2 = certify(smoothed, x, n0=100, n=10_000, alpha=0.001)
    smoothed = RandomizedSmoothing(base, {"sigma": 0.5, "batch_size": 20_000, "seed": 1})
    linf = certify(smoothed, x, n0=100, n=10_000, alpha=0.001, norm="linf")
    assert linf.radius[0] == pytest.approx(l2.radius[0] / math.sqrt(2))
    assert l2.prediction[1] == ABSTAIN and l2.radius[1] == 0 and l2.abstained[1]
    assert l2.seconds.shape == (2,) and (l2.seconds > 0).all()


def test_seeded():
    base = threshold_model(0.2)
    x = torch.tensor([[[[0.45, 0.5]]]])
    runs = [
        certify(RandomizedSmoothing(base, {"seed": 3}), x, n0=10, n=500, alpha=0.01).p_a_lower[0]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_dp_baseline_is_below_neyman_pearson_and_sound():
    p = np.array([0.6, 0.9, 0.99, 0.999])
    laplace = dp_radius(Noise.LAPLACE, 0.5, p)
    assert laplace == pytest.approx(0.25 * np.log(p / (1 - p)))
    assert (laplace <= certified_radius(Noise.LAPLACE, 0.5, p)).all()
    gaussian = dp_radius(Noise.GAUSSIAN, 0.5, p)
    assert (gaussian <= certified_radius(Noise.GAUSSIAN, 0.5, p)).all()
    assert gaussian[-1] > 0
    # The returned radius meets PixelDP's condition for some (eps, delta) with eps <= 1.
    eps = np.linspace(1e-3, 1, 1000)[:, None]
    delta = (gaussian[-1] * 0 + 1) * np.logspace(-15, -1, 57)[None, :]
    size = 0.5 * eps / np.sqrt(2 * np.log(1.25 / delta))
    ok = p[-1] > np.exp(2 * eps) * (1 - p[-1]) + (1 + np.exp(eps)) * delta
    assert np.isclose(size[ok].max(), gaussian[-1])


def test_clear_errors():
    smoothed = RandomizedSmoothing(threshold_model(0.2), {"noise": "uniform"})
    x = torch.tensor([[[[0.5, 0.5]]]])
    with pytest.raises(ConfigError, match="l1 radii, not 'l2'"):
        certify(smoothed, x, 10, 100, 0.001, norm="l2")
    with pytest.raises(ConfigError, match="not uniform"):
        certify(smoothed, x, 10, 100, 0.001, bound=Bound.DIFFERENTIAL_PRIVACY)
    with pytest.raises(ConfigError, match="alpha=1.5"):
        certify(smoothed, x, 10, 100, 1.5)


def test_certified_accuracy_is_below_eot_attack_accuracy(mnist_subset):
    """Soundness: at each l2 radius r, the fraction certified correct at r is at most the
    smoothed classifier's accuracy under an l2 EOT attack (PGD through the soft smoothed
    classifier, Salman et al. 2019) of size r."""
    data = mnist_subset(20)
    base = load_zoo_model("mnist-cnn-gaussian-0.25")
    cert = certify(
        RandomizedSmoothing(base, {"sigma": 0.25, "seed": 0}), data.x, n0=20, n=300, alpha=0.001
    )
    y = data.y.numpy()
    attacked = RandomizedSmoothing(
        base, {"sigma": 0.25, "samples": 50, "bpda": True, "eot_samples": 4, "seed": 1}
    )
    for r in (0.2, 0.4):  # n = 300 certifies at most 0.25 * Phi^-1(0.001^(1/300)) = 0.5
        certified = cert.certified_correct(y, r).mean()
        robust = PGDL2({"steps": 5})(attacked, data.x, data.y, r).robust_accuracy
        assert 0 < certified <= robust, (r, certified, robust)  # and not vacuous
