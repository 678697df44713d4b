"""Every smoothing certificate on every smoothing model of the zoo, from the same draws: the
orderings the literature proves hold on every image."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import list_models, load_zoo_model
from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.defense.smoothing.certify import Bound, certify_every_bound, estimate
from aisafety.defense.smoothing.noise import Noise

# the noise each smoothing training recipe trains the base classifier for
RECIPE_NOISE = {
    "gaussian-augmentation": Noise.GAUSSIAN,
    "macer": Noise.GAUSSIAN,
    "smoothadv": Noise.GAUSSIAN,
    "adre": Noise.GAUSSIAN,
    "laplace-augmentation": Noise.LAPLACE,
    "uniform-augmentation": Noise.UNIFORM,
}


def smoothing_models() -> list[tuple[str, Noise, float]]:
    entries = [entry for entry, _ in list_models().values()]
    return [
        (e.name, RECIPE_NOISE[e.recipe.defense], float(e.recipe.defense_config["sigma"]))
        for e in entries
        if e.recipe.defense in RECIPE_NOISE and e.dataset == "mnist"
    ]


def test_every_smoothing_recipe_has_a_zoo_model():
    assert set(RECIPE_NOISE) <= {entry.recipe.defense for entry, _ in list_models().values()}


@pytest.mark.parametrize(("name", "noise", "sigma"), smoothing_models())
def test_proved_orderings_per_image(name, noise, sigma):
    """One estimate (n = 200 draws on 12 images), every bound defined for the noise: the same
    answers and p_A; Neyman-Pearson's radius >= every other bound's, Rényi's >= KL's; and
    some image is certified (the comparison is not all zeros)."""
    torch.manual_seed(0)
    x = EmbeddedMnist().load(None, "test").balanced_subset(12, 0).x
    settings = {"noise": noise.value, "sigma": sigma, "seed": 0, "batch_size": 1000}
    est = estimate(RandomizedSmoothing(load_zoo_model(name), settings), x, 20, 200, 0.001)
    certs = certify_every_bound(est)
    expected = {Bound.NEYMAN_PEARSON} if noise is Noise.UNIFORM else set(Bound)
    assert set(certs) == expected
    top = certs[Bound.NEYMAN_PEARSON]
    assert (top.radius > 0).any()
    for cert in certs.values():
        assert np.array_equal(cert.prediction, top.prediction)
        assert np.all(cert.radius <= top.radius)
    if noise is not Noise.UNIFORM:
        renyi, kl = certs[Bound.RENYI].radius, certs[Bound.F_DIVERGENCE].radius
        assert np.all(renyi >= kl * (1 - 2e-9))
