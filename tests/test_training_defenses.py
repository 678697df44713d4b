"""Training defenses: each loss on a hand-checkable case, bounds against brute force, plumbing."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aisafety.cli import main
from aisafety.database.architectures import build
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import TrainingRecipe, ZooEntry, read_manifest, write_manifest_entry
from aisafety.defense.training.base import TrainingStep
from aisafety.defense.training.distillation import soft_cross_entropy, soft_labels
from aisafety.defense.training.fgsm_at import fgsm_rs_examples
from aisafety.defense.training.gaussian_augmentation import gaussian_noisy
from aisafety.defense.training.hypervolume import (
    ascending_budget,
    confidence_margin,
    frontier_examples,
)
from aisafety.defense.training.ibp import (
    certified,
    crown_ibp_margin_bounds,
    ibp_margin_bounds,
    ramp,
)
from aisafety.defense.training.loop import fit
from aisafety.defense.training.trades import robustness_kl, trades_loss
from aisafety.errors import ConfigError, UnknownNameError
from aisafety.evaluation.metrics.certified import ibp_certified_mask
from aisafety.plugins import default_registry
from aisafety.prediction.torch_module import Normalize
from aisafety.zoo_build import training_defense
from tests.test_verification import two_layer_net

LN3 = math.log(3)


def small_conv_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        Normalize((0.5,), (0.25,)),
        nn.Conv2d(1, 3, 4, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 12), nn.ReLU(), nn.Linear(12, 5),
    )  # fmt: skip


# --- IBP / CROWN-IBP -------------------------------------------------------------------------


def test_ibp_margin_bounds_of_a_two_layer_net_match_the_hand_computation():
    # box [0.4, 0.6]^2 -> layer 1: centre (0, 0.5), radius |W| (0.1, 0.1) = (0.2, 0.3)
    # -> z in [-0.2, 0.2] x [0.2, 0.8] -> ReLU [0, 0.2] x [0.2, 0.8]
    # f0 - f1 = 2 h1 - 3 h2 + 0.5 >= 2 * 0 - 3 * 0.8 + 0.5 = -1.9
    net = two_layer_net()
    x = torch.tensor([[0.5, 0.5]])
    bounds = ibp_margin_bounds(net, x, torch.tensor([0]), 0.1)
    assert bounds[0].tolist() == pytest.approx([0.0, -1.9], abs=1e-6)
    # f1 - f0 = -2 h1 + 3 h2 - 0.5 >= -0.4 + 0.6 - 0.5 = -0.3 (not certified either)
    bounds = ibp_margin_bounds(net, x, torch.tensor([1]), 0.1)
    assert bounds[0].tolist() == pytest.approx([-0.3, 0.0], abs=1e-6)
    # eps = 0.01: h1 in [0, 0.02], h2 in [0.47, 0.53] -> f1 - f0 >= -0.04 + 1.41 - 0.5 = 0.87
    bounds = ibp_margin_bounds(net, x, torch.tensor([1]), 0.01)
    assert bounds[0, 0].item() == pytest.approx(0.87, abs=1e-6)
    assert certified(bounds, torch.tensor([1])).tolist() == [True]


def test_certified_needs_every_other_margin_positive():
    margins = torch.tensor([[0.0, 0.2, 0.1], [0.0, 0.3, -0.1], [1.0, 0.0, 2.0]])
    assert certified(margins, torch.tensor([0, 0, 1])).tolist() == [True, False, True]


@pytest.mark.parametrize("bound", [ibp_margin_bounds, crown_ibp_margin_bounds])
def test_bounds_are_sound_and_exact_at_eps_zero(bound):
    net = small_conv_net()
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(6, 1, 16, 16, generator=generator)
    y = torch.randint(0, 5, (6,), generator=generator)
    with torch.no_grad():
        logits = net(x)
        exact = logits.gather(1, y[:, None]) - logits
        assert torch.allclose(bound(net, x, y, 0.0), exact, atol=1e-5)
        lower = bound(net, x, y, 0.03)
        for _ in range(64):  # no sampled point of the ball may beat the bound
            noise = 2 * torch.rand(x.shape, generator=generator) - 1
            out = net((x + 0.03 * noise).clamp(0, 1))
            assert (out.gather(1, y[:, None]) - out >= lower - 1e-5).all()


def test_crown_ibp_is_tighter_than_ibp_on_average():
    net = small_conv_net()
    x = torch.rand(8, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    y = torch.zeros(8, dtype=torch.long)
    with torch.no_grad():
        gap = crown_ibp_margin_bounds(net, x, y, 0.02) - ibp_margin_bounds(net, x, y, 0.02)
    assert gap[:, 1:].mean() > 0


def test_crown_ibp_refuses_max_pooling_with_the_fix():
    with pytest.raises(ConfigError, match="MaxPool2d.*mnist-cnn-strided"):
        crown_ibp_margin_bounds(
            build("mnist-cnn"), torch.rand(1, 1, 28, 28), torch.tensor([0]), 0.1
        )


def test_certified_accuracy_is_below_pgd_robust_and_clean_accuracy():
    from aisafety.database.zoo import load_zoo_model
    from aisafety.zoo_build import pgd_robust_accuracy

    predictor = load_zoo_model("mnist-cnn-pgd-at")
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[::10], data.y[::10]
    eps = 0.02
    cert = ibp_certified_mask(predictor.network, x, y, eps).double().mean().item()
    robust = pgd_robust_accuracy(predictor, x, y, eps, steps=10)
    clean = (predictor.predict(x) == y).double().mean().item()
    assert cert <= robust <= clean
    assert cert > 0  # the bound is not vacuous at a small radius


def test_ibp_schedules_ramp_after_warmup():
    assert [ramp(p, 1.0, 2.0) for p in (0.5, 1.0, 2.0, 3.0, 9.0)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert ramp(0.5, 0.0, 0.0) == 1.0


# --- TRADES, distillation, FGSM, Gaussian, AH ------------------------------------------------


def test_trades_kl_by_hand_and_zero_when_adversarial_equals_clean():
    clean, adv = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, LN3]])
    # KL((1/2, 1/2) || (1/4, 3/4)) = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)
    assert robustness_kl(clean, adv).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    net = small_conv_net()
    x, y = torch.rand(4, 1, 16, 16), torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        assert trades_loss(net, x, x, y, beta=6.0).item() == pytest.approx(
            F.cross_entropy(net(x), y).item(), abs=1e-6
        )


def test_distillation_soft_labels_follow_the_temperature():
    t = 4.0
    logits = torch.tensor([[0.0, LN3 * t]])
    assert soft_labels(logits, t)[0].tolist() == pytest.approx([0.25, 0.75], abs=1e-6)
    assert soft_labels(logits, 1.0)[0, 1].item() == pytest.approx(81 / 82, abs=1e-6)
    one_hot = torch.tensor([[0.0, 1.0]])
    assert soft_cross_entropy(logits, one_hot).item() == pytest.approx(
        F.cross_entropy(logits, torch.tensor([1])).item(), abs=1e-6
    )


def test_fgsm_rs_lands_on_the_signed_corner_when_the_step_covers_the_ball():
    # Linear score w.x: from any random start, a step of 2 eps along sign(grad) clipped to
    # the ball ends exactly at x + eps sign(grad) (away from the [0, 1] edges).
    w = torch.tensor([[1.0, -2.0, 0.5, -0.1], [-1.0, 2.0, -0.5, 0.1]])
    net = nn.Linear(4, 2, bias=False)
    net.weight.data.copy_(w)
    x, y = torch.full((3, 4), 0.5), torch.zeros(3, dtype=torch.long)
    x_adv = fgsm_rs_examples(net, x, y, 0.1, 0.2, torch.Generator().manual_seed(0))
    expected = x + 0.1 * torch.sign(w[1] - w[0])
    assert torch.allclose(x_adv, expected.expand_as(x_adv), atol=1e-6)


def test_gaussian_augmentation_noise_has_the_configured_std():
    noisy = gaussian_noisy(torch.zeros(200_000), 0.5, torch.Generator().manual_seed(0))
    assert noisy.mean().item() == pytest.approx(0.0, abs=0.01)
    assert noisy.std().item() == pytest.approx(0.5, abs=0.005)


def test_hypervolume_budget_ascends_per_epoch_and_frontier_lowers_confidence():
    assert [ascending_budget(0.3, p, 3) for p in (0.0, 0.99, 1.0, 2.5, 3.0)] == pytest.approx(
        [0.1, 0.1, 0.2, 0.3, 0.3]
    )
    logits = torch.tensor([[0.0, LN3], [LN3, 0.0]])
    assert confidence_margin(logits, torch.tensor([1, 1])).tolist() == pytest.approx([0.5, -0.5])
    net = small_conv_net()
    x, y = torch.rand(8, 1, 16, 16), torch.arange(8) % 5
    x_f = frontier_examples(net, x, y, 0.1, 5, 0.03)
    assert (x_f - x).abs().max() <= 0.1 + 1e-6
    with torch.no_grad():
        assert confidence_margin(net(x_f), y).sum() < confidence_margin(net(x), y).sum()


# --- training plumbing -----------------------------------------------------------------------

FAST = {
    "fgsm-at": {"eps": 0.1},
    "trades": {"eps": 0.1, "steps": 2, "step_size": 0.05, "warmup_epochs": 0},
    "gaussian-augmentation": {"sigma": 0.25},
    "crown-ibp": {"eps": 0.05, "warmup_epochs": 0, "ramp_epochs": 0},
    "adversarial-hypervolume": {"eps": 0.1, "frontier_steps": 2, "steps": 2},
}


@pytest.mark.parametrize("name", sorted(FAST))
def test_a_few_training_steps_reduce_the_defense_loss(name):
    data = EmbeddedMnist().load(None, "test")
    index = torch.arange(0, 1000, 5)  # 200 images, 20 per class
    subset = dataclasses.replace(data, x=data.x[index], y=data.y[index])
    recipe = TrainingRecipe(architecture="mnist-cnn-strided", epochs=3, batch_size=25, lr=1e-2)
    defense = training_defense(name, FAST[name])
    torch.manual_seed(0)
    network = nn.Sequential(Normalize(recipe.mean, recipe.std), build(recipe.architecture))
    at_end = TrainingStep(float(recipe.epochs), recipe.epochs, torch.Generator().manual_seed(9))

    def batch_loss() -> float:
        torch.manual_seed(1)
        at_end.generator.manual_seed(9)
        return defense.loss(network, subset.x[:50], subset.y[:50], at_end).item()

    before = batch_loss()
    fit(network, defense, subset, recipe, torch.Generator().manual_seed(0), quiet=True)
    assert batch_loss() < 0.8 * before


def test_distillation_trains_a_teacher_then_a_student_on_its_soft_labels():
    data = EmbeddedMnist().load(None, "test")
    subset = dataclasses.replace(data, x=data.x[::5], y=data.y[::5])
    recipe = TrainingRecipe(epochs=3, batch_size=25, lr=1e-2)
    defense = training_defense("distillation", {"temperature": 10})
    network = nn.Sequential(Normalize(recipe.mean, recipe.std), build(recipe.architecture))
    defense.prepare(network, lambda net, stage: fit(net, stage, subset, recipe, torch.Generator()))
    teacher = defense.teacher
    assert teacher is not None and teacher is not network
    with torch.no_grad():
        accuracy = (teacher(subset.x).argmax(1) == subset.y).float().mean().item()
    assert accuracy > 0.5  # 200 images, 24 steps: well above chance


def test_recipe_with_defense_config_round_trips_through_the_manifest(tmp_path):
    recipe = TrainingRecipe(
        architecture="mnist-cnn-strided",
        defense="crown-ibp",
        defense_config={"eps": 0.2, "warmup_epochs": 0.2, "ramp_epochs": 1.3, "kappa_end": 0.0},
        epochs=3,
        init_from="mnist-cnn",
        init_sha256="ab" * 32,
    )
    entry = ZooEntry(
        name="x", file="x.pt", sha256="0" * 64, architecture=recipe.architecture,
        dataset="mnist", input_shape=(1, 28, 28), num_classes=10, mean=recipe.mean,
        std=recipe.std, recipe=recipe, metrics={"clean_accuracy": 0.5},
    )  # fmt: skip
    write_manifest_entry(tmp_path, entry)
    again = read_manifest(tmp_path)["x"]
    assert again == entry
    defense = training_defense(again.recipe.defense, again.recipe.defense_config)
    assert defense.config.model_dump() == {**recipe.defense_config, "eps": 0.2, "kappa_start": 1.0}


def test_unknown_or_misconfigured_training_defense_names_the_fix():
    with pytest.raises(UnknownNameError, match="trades"):
        training_defense("tradez", {})
    with pytest.raises(UnknownNameError, match="training defense"):
        training_defense("bit-depth", {})  # an input defense cannot train
    with pytest.raises(ConfigError, match="beta"):
        training_defense("trades", {"beta": -1})


def test_training_defense_cannot_wrap_a_predictor():
    from aisafety.database.zoo import load_zoo_model

    registry = default_registry()
    with pytest.raises(ConfigError, match="aisafety zoo train --defense trades"):
        registry.create("defense", "trades", {}, load_zoo_model("mnist-cnn"))


def test_list_defenses_shows_every_training_defense(capsys):
    assert main(["list", "defenses", "--format", "json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    expected = {
        "standard", "pgd-at", "fgsm-at", "trades", "distillation", "gaussian-augmentation",
        "ibp", "crown-ibp", "adversarial-hypervolume",
    }  # fmt: skip
    assert expected <= set(listed)
    assert all(listed[n]["kind"] == "training" for n in expected)
    assert listed["trades"]["config"]["beta"] == 6.0
