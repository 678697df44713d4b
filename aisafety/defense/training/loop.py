"""The one training loop every training defense runs in.

The loop owns data order, optimiser and schedule (Adam with a one-cycle learning rate); a
defense only says what to minimise on each batch (``TrainingDefense.loss``), so every defense
trains, seeds and records its recipe the same way. Which defense a recipe names is resolved by
the caller (``aisafety.database.zoo_build``), through the registry.
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm import tqdm

from aisafety.database.architectures import build
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.zoo import TrainingRecipe
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.errors import ConfigError
from aisafety.prediction.torch_module import Normalize


def fit(
    network: nn.Module,
    defense: TrainingDefense,
    train_set: LoadedDataset,
    recipe: TrainingRecipe,
    generator: torch.Generator,
    quiet: bool = False,
) -> None:
    """The one training loop: Adam with a one-cycle schedule on ``defense.loss``."""
    optimiser = torch.optim.Adam(network.parameters(), lr=recipe.lr)
    steps_per_epoch = -(-len(train_set) // recipe.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=recipe.lr, total_steps=recipe.epochs * steps_per_epoch
    )
    for epoch in range(recipe.epochs):
        network.train()
        order = torch.randperm(len(train_set), generator=generator)
        batches = order.split(recipe.batch_size)
        for step, index in enumerate(
            tqdm(batches, desc=f"{defense.name} epoch {epoch + 1}/{recipe.epochs}", disable=quiet)
        ):
            where = TrainingStep(epoch + step / len(batches), recipe.epochs, generator)
            loss = defense.loss(network, train_set.x[index], train_set.y[index], where)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            defense.after_step(network)
            schedule.step()
    network.eval()


def train_network(
    recipe: TrainingRecipe,
    defense: TrainingDefense,
    train_set: LoadedDataset,
    initial_state: dict[str, torch.Tensor] | None = None,
    quiet: bool = False,
) -> nn.Module:
    """Train ``recipe.architecture`` on ``train_set`` with ``defense`` (the recipe's defense,
    built by the caller), starting from ``initial_state`` if given; returns the module.

    The seed fixes initialisation, data order and every random draw of the defense, so a
    recipe trains the same model again (up to floating-point non-determinism).
    """
    if recipe.optimizer != "adam":
        raise ConfigError(f"optimizer {recipe.optimizer!r} is not supported; use 'adam'")
    if defense.name != recipe.defense:
        raise ConfigError(
            f"the recipe names training defense {recipe.defense!r}, but {defense.name!r} was "
            "given; build the defense the recipe names"
        )
    if defense.architecture not in (None, recipe.architecture):
        raise ConfigError(
            f"training defense {defense.name!r} needs architecture {defense.architecture!r}, "
            f"the recipe has {recipe.architecture!r}; pass --architecture {defense.architecture}"
        )
    torch.manual_seed(recipe.seed)
    module = build(recipe.architecture)
    if initial_state is not None:
        module.load_state_dict(initial_state)
    network = nn.Sequential(Normalize(recipe.mean, recipe.std), module)
    generator = torch.Generator().manual_seed(recipe.seed)

    def run(net: nn.Module, stage: TrainingDefense) -> None:
        fit(net, stage, train_set, recipe, generator, quiet)

    defense.prepare(network, run)
    run(network, defense)
    return module.eval()
