"""The one training loop every training defense runs in.

The loop owns data order, optimiser and schedule (the recipe's: Adam with a one-cycle
learning rate by default, or SGD / a step schedule as the SoK's VeriGauge code trains) and
which epoch's weights are kept; a defense only says what to minimise on each batch
(``TrainingDefense.loss``) and, for ``keep: best-test``, how an epoch scores
(``TrainingDefense.selection_score``), so every defense trains, seeds and records its recipe
the same way. Which defense a recipe names is resolved by the caller
(``aisafety.zoo_build``), through the registry.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from aisafety.database.architectures import build
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.zoo import TrainingRecipe
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.errors import ConfigError
from aisafety.prediction.torch_module import Normalize


@dataclass(frozen=True)
class Selection:
    """The epoch ``keep: best-test`` kept (0-based) and its score on the selection set."""

    epoch: int
    score: float


def optimiser_for(recipe: TrainingRecipe, network: nn.Module) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(
            network.parameters(), lr=recipe.lr, momentum=recipe.momentum,
            weight_decay=recipe.weight_decay,
        )  # fmt: skip
    return torch.optim.Adam(network.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)


def schedule_for(
    recipe: TrainingRecipe, optimiser: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """The per-batch learning-rate schedule (stepped after every optimiser step)."""
    if recipe.lr_schedule == "one-cycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimiser, max_lr=recipe.lr, total_steps=recipe.epochs * steps_per_epoch
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: step_factor(recipe, step // steps_per_epoch)
    )


def step_factor(recipe: TrainingRecipe, epoch: int) -> float:
    """The step schedule's lr multiplier in ``epoch`` (0-based)."""
    decays = max(0, epoch - recipe.lr_decay_from) // recipe.lr_decay_every
    return recipe.lr_decay**decays


def fit(
    network: nn.Module,
    defense: TrainingDefense,
    train_set: LoadedDataset,
    recipe: TrainingRecipe,
    generator: torch.Generator,
    quiet: bool = False,
    select_on: LoadedDataset | None = None,
) -> Selection | None:
    """The one training loop: the recipe's optimiser and schedule on ``defense.loss``.

    With ``select_on`` (the test set, for ``keep: best-test``) every epoch is scored by
    ``defense.selection_score`` and the best-scoring epoch's weights are loaded at the end
    (ties: the later epoch where ``defense.later_wins_ties``); returns that epoch."""
    optimiser = optimiser_for(recipe, network)
    steps_per_epoch = -(-len(train_set) // recipe.batch_size)
    schedule = schedule_for(recipe, optimiser, steps_per_epoch)
    best: tuple[Selection, dict[str, torch.Tensor]] | None = None
    for epoch in range(recipe.epochs):
        network.train()
        started = time.process_time()
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
        if select_on is None:
            continue
        trained = time.process_time() - started
        network.eval()
        score = defense.selection_score(network, select_on, epoch)
        if score is not None and (
            best is None
            or score > best[0].score
            or (score == best[0].score and defense.later_wins_ties)
        ):
            best = Selection(epoch, score), copy.deepcopy(network.state_dict())
        if not quiet:
            kept = "" if best is None else f"; kept epoch {best[0].epoch + 1}"
            shown = "not eligible" if score is None else f"{score:.4f}"
            clean = TrainingDefense.selection_score(defense, network, select_on, epoch)
            print(
                f"epoch {epoch + 1}/{recipe.epochs}: clean accuracy {clean:.4f}, "
                f"{defense.selection_metric} {shown}{kept} "
                f"({trained:.1f} s CPU training, {time.process_time() - started - trained:.1f} "
                "s selecting)",
                file=sys.stderr,
                flush=True,
            )
    if best is not None:
        network.load_state_dict(best[1])
    network.eval()
    return None if best is None else best[0]


def train_network(
    recipe: TrainingRecipe,
    defense: TrainingDefense,
    train_set: LoadedDataset,
    initial_state: dict[str, torch.Tensor] | None = None,
    quiet: bool = False,
    select_on: LoadedDataset | None = None,
) -> tuple[nn.Module, Selection | None]:
    """Train ``recipe.architecture`` on ``train_set`` with ``defense`` (the recipe's defense,
    built by the caller), starting from ``initial_state`` if given; returns the module and,
    for ``keep: best-test``, the epoch kept by its score on ``select_on`` (the test set).

    The seed fixes initialisation, data order and every random draw of the defense, so a
    recipe trains the same model again (up to floating-point non-determinism).
    """
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
    if recipe.keep == "best-test" and select_on is None:
        raise ConfigError(
            "the recipe keeps the best epoch on the test set (keep: best-test), but no test "
            "set was given; pass the test set to select on, or use keep: last"
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
    selection = fit(
        network, defense, train_set, recipe, generator, quiet,
        select_on if recipe.keep == "best-test" else None,
    )  # fmt: skip
    return module.eval(), selection
