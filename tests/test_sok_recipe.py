"""The SoK's training schedules as recipe options (docs/certification.md, "SoK benchmark"):
SGD with a step lr, PGD from the clean input with a relative step and a per-epoch eps ramp,
CROWN-IBP's robust-only loss, the best epoch kept on the test set; and the hand-written
MLP gradient and bounds that make them affordable, checked against autograd and the
general bound graph."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aisafety.cli import build_parser
from aisafety.cli.zoo import zoo_recipe
from aisafety.database.architectures import build
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import TrainingRecipe
from aisafety.defense.adversarial_training import (
    PGDTrainingConfig,
    ascend_linf,
    budget_at,
    pgd_examples,
    step_at,
)
from aisafety.defense.mlp_gradient import ReluMlp, relu_mlp_layers
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.defense.training.loop import fit, step_factor
from aisafety.defense.training.mlp_bounds import mlp_margin_bounds
from aisafety.errors import ConfigError
from aisafety.prediction.torch_module import Normalize
from aisafety.verification.margins import (
    crown_ibp_margin_bounds,
    ibp_margin_bounds,
    robust_cross_entropy,
)
from aisafety.zoo_build import train_selected, training_defense


def mlp(architecture: str = "fcnn-a", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(Normalize((0.1307,), (0.3081,)), build(architecture))


def batch(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    data = EmbeddedMnist().load(None, "test")
    return data.x[:n], data.y[:n]


@pytest.mark.parametrize("architecture", ["fcnn-a", "fcnn-b"])
def test_hand_written_mlp_gradient_equals_autograd(architecture):
    network = mlp(architecture)
    x, y = batch()
    x_grad = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(F.cross_entropy(network(x_grad), y, reduction="sum"), x_grad)
    got = ReluMlp.of(network).cross_entropy_gradient(x, y)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


def test_only_plain_relu_mlps_get_the_hand_written_path():
    assert relu_mlp_layers(mlp()) is not None
    assert relu_mlp_layers(build("mnist-cnn")) is None
    tanh = nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.Tanh(), nn.Linear(10, 10))
    assert relu_mlp_layers(tanh) is None


def test_pgd_on_an_mlp_matches_autograd_pgd():
    network = mlp()
    x, y = batch()
    fast = pgd_examples(network, x, y, 0.1, 20, 0.01, torch.Generator(), random_start=False)

    def objective(logits):
        return F.cross_entropy(logits, y, reduction="sum")

    reference = ascend_linf(network, objective, x, x.clone(), 0.1, 20, 0.01)
    # the same steps; a gradient entry within rounding of 0 may take the other sign
    assert (fast == reference).float().mean() > 0.999
    assert (fast - x).abs().max() <= 0.1 + 1e-6


def test_pgd_without_random_start_takes_its_first_step_from_the_clean_input():
    network = mlp()
    x, y = batch()
    one = pgd_examples(network, x, y, 0.3, 1, 0.006, torch.Generator(), random_start=False)
    sign = ReluMlp.of(network).cross_entropy_gradient(x, y).sign()
    torch.testing.assert_close(one, (x + 0.006 * sign).clamp(0, 1))


def test_verigauge_eps_ramp_is_constant_within_an_epoch_and_the_step_relative():
    config = PGDTrainingConfig(eps=0.3, warmup_epochs=20, warmup="per-epoch", relative_step=0.02)
    # VeriGauge: eps * min((epoch + 1) / 20, 1) for the whole of epoch `epoch` (0-based)
    assert budget_at(config, 0) == pytest.approx(0.015)
    assert budget_at(config, 0.99) == pytest.approx(0.015)
    assert budget_at(config, 9.5) == pytest.approx(0.15)
    assert budget_at(config, 19) == pytest.approx(0.3) and budget_at(config, 39.9) == 0.3
    assert step_at(config, 0.15) == pytest.approx(0.003)
    assert step_at(PGDTrainingConfig(step_size=0.05), 0.15) == 0.05


def test_step_schedules_are_the_soks():
    pgd = TrainingRecipe(lr_schedule="step", lr_decay=0.2, lr_decay_every=10)
    assert [step_factor(pgd, e) for e in (0, 9, 10, 19, 20, 30, 39)] == pytest.approx(
        [1, 1, 0.2, 0.2, 0.04, 0.008, 0.008]
    )
    # CROWN-IBP: StepLR(10, 0.5) stepped with max(t - 61 + 1, 0) after epoch t
    crown = TrainingRecipe(lr_schedule="step", lr_decay=0.5, lr_decay_every=10, lr_decay_from=61)
    for epoch in range(100):
        assert step_factor(crown, epoch) == 0.5 ** (max(epoch - 1 - 60, 0) // 10)


@pytest.mark.parametrize("architecture", ["fcnn-a", "fcnn-b"])
@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_mlp_bounds_and_their_gradients_equal_the_graph_codes(architecture, beta):
    network = mlp(architecture)
    x, y = batch()
    eps = 0.05
    reference = beta * crown_ibp_margin_bounds(network, x, y, eps)
    reference = reference + (1 - beta) * ibp_margin_bounds(network, x, y, eps)
    fast = mlp_margin_bounds(*relu_mlp_layers(network), x, y, eps, beta)
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-4)
    gradients = []
    for bound in (reference, fast):
        network.zero_grad()
        robust_cross_entropy(bound, y).backward(retain_graph=True)
        gradients.append([p.grad.clone() for p in network.parameters()])
    for got, expected in zip(*gradients, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_robust_only_crown_ibp_loss_has_no_clean_term():
    defense = training_defense(
        "crown-ibp", {"eps": 0.1, "warmup_epochs": 1, "ramp_epochs": 60, "kappa_start": 0}
    )
    network = mlp()
    x, y = batch()
    step = TrainingStep(31.0, 100, torch.Generator())  # half-way: eps 0.05, beta 0.5
    bound = mlp_margin_bounds(*relu_mlp_layers(network), x, y, 0.05, 0.5)
    torch.testing.assert_close(defense.loss(network, x, y, step), robust_cross_entropy(bound, y))
    clean = TrainingStep(0.5, 100, torch.Generator())  # the natural first epoch
    torch.testing.assert_close(defense.loss(network, x, y, clean), F.cross_entropy(network(x), y))


def test_ibp_selection_waits_for_the_epoch_after_the_first_full_eps_one():
    defense = training_defense("crown-ibp", {"eps": 0.1, "warmup_epochs": 1, "ramp_epochs": 60})
    data = EmbeddedMnist().load(None, "test")
    assert defense.selection_score(mlp(), data, 61) is None
    score = defense.selection_score(mlp(), data, 62)
    assert score is not None and 0 <= score <= 1
    assert defense.later_wins_ties


class ScriptedScore(TrainingDefense):
    """A defense whose epochs score as scripted; records the weights each epoch had."""

    name = "scripted"
    scores: list[float] = []

    def __init__(self, later_wins_ties: bool):
        super().__init__({})
        self.later_wins_ties = later_wins_ties  # type: ignore[misc]
        self.weights: list[torch.Tensor] = []

    def loss(self, network, x, y, step):
        return F.cross_entropy(network(x), y)

    def selection_score(self, network, data, epoch):
        self.weights.append(network[1][1].weight.detach().clone())
        return self.scores[epoch]


@pytest.mark.parametrize("later_wins_ties, kept", [(False, 1), (True, 3)])
def test_best_test_keeps_the_best_scoring_epochs_weights(later_wins_ties, kept):
    data = EmbeddedMnist().load(None, "test")
    small = LoadedDataset(data.name, data.x[:200], data.y[:200], data.classes)
    defense = ScriptedScore(later_wins_ties)
    defense.scores = [0.2, 0.5, 0.1, 0.5]
    network = mlp()
    recipe = TrainingRecipe(architecture="fcnn-a", epochs=4, batch_size=50, keep="best-test")
    selection = fit(network, defense, small, recipe, torch.Generator(), True, small)
    assert selection is not None and selection.epoch == kept and selection.score == 0.5
    torch.testing.assert_close(network[1][1].weight, defense.weights[kept])
    assert not torch.equal(defense.weights[1], defense.weights[3])  # epochs 2 and 4 differ


def test_sgd_step_recipe_trains_and_records_the_kept_epoch():
    data = EmbeddedMnist().load(None, "test")
    recipe = TrainingRecipe(
        architecture="fcnn-a", defense="pgd-at", epochs=2, batch_size=20, optimizer="sgd",
        lr=0.1, momentum=0.1, weight_decay=5e-4, lr_schedule="step", lr_decay=0.2,
        lr_decay_every=1, keep="best-test", mean=(0.0,), std=(1.0,),
        defense_config={
            "eps": 0.1, "steps": 5, "relative_step": 0.2, "random_start": False,
            "warmup_epochs": 2, "warmup": "per-epoch", "select_steps": 5,
        },
    )  # fmt: skip
    module, record = train_selected(recipe, data, True, data)
    assert record["selected_epoch"] in (1.0, 2.0) and 0 <= record["selection_score"] <= 1
    # the returned weights are the kept epoch's: they score what was recorded
    network = nn.Sequential(Normalize((0.0,), (1.0,)), module)
    defense = training_defense(recipe.defense, recipe.defense_config)
    assert defense.selection_score(network, data, 0) == record["selection_score"]
    with pytest.raises(ConfigError, match="keep: best-test"):
        train_selected(recipe, data, True, None)


def test_existing_recipes_keep_their_schedule():
    recipe = TrainingRecipe.model_validate({"architecture": "fcnn-a", "epochs": 10})
    assert (recipe.optimizer, recipe.lr_schedule, recipe.keep) == ("adam", "one-cycle", "last")
    assert recipe.momentum == recipe.weight_decay == 0
    with pytest.raises(ValueError):
        TrainingRecipe(optimizer="rmsprop")


def test_zoo_train_options_set_the_schedule_fields():
    args = build_parser().parse_args(
        [
            "zoo", "train", "--data-dir", "x", "--optimizer", "sgd", "--momentum", "0.1",
            "--weight-decay", "5e-4", "--lr-schedule", "step", "--lr-decay", "0.2",
            "--lr-decay-every", "10", "--lr-decay-from", "61", "--keep", "best-test",
        ]
    )  # fmt: skip
    recipe = zoo_recipe(args)[0]
    assert (recipe.optimizer, recipe.lr_schedule, recipe.keep) == ("sgd", "step", "best-test")
    assert (recipe.momentum, recipe.weight_decay, recipe.lr_decay) == (0.1, 5e-4, 0.2)
    assert (recipe.lr_decay_every, recipe.lr_decay_from) == (10, 61)
    assert math.isclose(step_factor(recipe, 71), 0.2)
