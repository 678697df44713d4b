"""The smoothing noises and the training defenses built on them."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import kstest, laplace, norm, uniform

from aisafety.defense.smoothing.noise import Noise, sample_noise
from aisafety.defense.training.adre import Adre
from aisafety.defense.training.base import TrainingStep
from aisafety.defense.training.macer import Macer, soft_radius_hinge
from aisafety.defense.training.noise_augmentation import LaplaceAugmentation, UniformAugmentation
from aisafety.defense.training.smoothadv import SmoothAdv

REFERENCE = {
    Noise.GAUSSIAN: norm(scale=0.3),
    Noise.LAPLACE: laplace(scale=0.3),
    Noise.UNIFORM: uniform(loc=-0.3, scale=0.6),
}


@pytest.mark.parametrize("noise", list(Noise))
def test_noise_has_its_distribution(noise):
    draws = sample_noise(noise, 0.3, torch.Size([20_000]), torch.Generator().manual_seed(0), "cpu")
    assert kstest(draws.numpy(), REFERENCE[noise].cdf).pvalue > 0.01


def test_soft_radius_hinge_by_hand():
    # One copy, beta 1: g = softmax(logits); class 0 on top for both, label 0 and 1.
    logits = torch.tensor([[[2.0, 0.0], [2.0, 0.0]]])
    g = torch.softmax(torch.tensor([2.0, 0.0]), 0)
    margin = norm.ppf(g[0].item()) - norm.ppf(g[1].item())
    hinge = soft_radius_hinge(logits, torch.tensor([0, 1]), beta=1.0, gamma=8.0)
    assert hinge.item() == pytest.approx(8.0 - margin, rel=1e-5)  # only the right one counts
    assert soft_radius_hinge(logits, torch.tensor([0, 0]), 1.0, gamma=0.1).item() == 0.0


@pytest.mark.parametrize(
    "defense", [LaplaceAugmentation(), UniformAugmentation(), Macer(), SmoothAdv(), Adre()]
)
def test_training_losses_train(defense):
    """Every smoothing training loss (SmoothAdv and ADRE too, whose losses
    tests/test_smoothing_recipes.py checks by hand) falls on a separable toy problem."""
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    x, y = torch.rand(64, 1, 2, 2), torch.randint(0, 2, (64,))
    x[y == 1] += 2.0  # separable
    step = TrainingStep(0.0, 1, torch.Generator().manual_seed(0))
    optimiser = torch.optim.Adam(network.parameters(), lr=0.05)
    first = None
    for _ in range(30):
        loss = defense.loss(network, x, y, step)
        first = first if first is not None else loss.item()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    assert loss.item() < 0.75 * first


def test_shipped_macer_entry_fine_tunes_the_pinned_gaussian_model():
    """``mnist-cnn-macer-0.5``: one MACER epoch (k = 8, sigma 0.5) from the shipped
    ``mnist-cnn-gaussian-0.5``, pinned by its sha256, so ``zoo train --recipe-of`` rebuilds it."""
    from aisafety.database.zoo import list_models

    models = list_models()
    recipe = models["mnist-cnn-macer-0.5"][0].recipe
    assert recipe.defense == "macer" and recipe.defense_config == {"sigma": 0.5, "noise_samples": 8}
    assert recipe.init_from == "mnist-cnn-gaussian-0.5"
    assert recipe.init_sha256 == models["mnist-cnn-gaussian-0.5"][0].sha256
