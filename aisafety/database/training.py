"""Training a zoo model from a dataset folder: standard or PGD adversarial training."""

from __future__ import annotations

import io
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from aisafety.config_base import build_config
from aisafety.database.architectures import build
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.zoo import TrainingRecipe, ZooEntry, sha256_bytes, write_manifest_entry
from aisafety.defense.adversarial_training import PGDTrainingConfig, budget_at, pgd_examples
from aisafety.errors import ConfigError
from aisafety.prediction.torch_module import Normalize


def accuracy(network: nn.Module, data: LoadedDataset, batch_size: int = 1000) -> float:
    network.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(data), batch_size):
            logits = network(data.x[start : start + batch_size])
            correct += int((logits.argmax(1) == data.y[start : start + batch_size]).sum())
    return correct / len(data)


TRAINING_DEFENSES = ("standard", "pgd-at")


def train(recipe: TrainingRecipe, train_set: LoadedDataset, quiet: bool = False) -> nn.Module:
    """Train ``recipe.architecture`` on ``train_set``; returns the module.

    ``standard``: cross-entropy on clean inputs. ``pgd-at``: cross-entropy on PGD examples
    (``recipe.defense_config``: eps, steps, step_size, warmup_epochs).
    """
    if recipe.optimizer != "adam":
        raise ConfigError(f"optimizer {recipe.optimizer!r} is not supported; use 'adam'")
    if recipe.defense not in TRAINING_DEFENSES:
        raise ConfigError(
            f"training defense {recipe.defense!r} is unknown; known: {', '.join(TRAINING_DEFENSES)}"
        )
    adversarial = (
        build_config("training defense 'pgd-at'", PGDTrainingConfig, recipe.defense_config)
        if recipe.defense == "pgd-at"
        else None
    )
    torch.manual_seed(recipe.seed)
    module = build(recipe.architecture)
    network = nn.Sequential(Normalize(recipe.mean, recipe.std), module)
    optimiser = torch.optim.Adam(network.parameters(), lr=recipe.lr)
    generator = torch.Generator().manual_seed(recipe.seed)
    steps_per_epoch = -(-len(train_set) // recipe.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=recipe.lr, total_steps=recipe.epochs * steps_per_epoch
    )
    for epoch in range(recipe.epochs):
        network.train()
        order = torch.randperm(len(train_set), generator=generator)
        batches = order.split(recipe.batch_size)
        for step, index in enumerate(
            tqdm(batches, desc=f"epoch {epoch + 1}/{recipe.epochs}", disable=quiet)
        ):
            x, y = train_set.x[index], train_set.y[index]
            if adversarial is not None:
                eps = budget_at(adversarial, epoch + step / len(batches))
                x = pgd_examples(
                    network, x, y, eps, adversarial.steps, adversarial.step_size, generator
                )
            loss = nn.functional.cross_entropy(network(x), y)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
    return module.eval()


def train_zoo_entry(
    name: str,
    recipe: TrainingRecipe,
    train_set: LoadedDataset,
    test_set: LoadedDataset,
    out_dir: Path,
    quiet: bool = False,
) -> ZooEntry:
    """Train, measure clean accuracy on ``test_set``, write checkpoint + manifest entry."""
    started = time.time()
    module = train(recipe, train_set, quiet=quiet)
    network = nn.Sequential(Normalize(recipe.mean, recipe.std), module)
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    data = buffer.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    file = f"{name}.pt"
    (out_dir / file).write_bytes(data)
    entry = ZooEntry(
        name=name,
        file=file,
        sha256=sha256_bytes(data),
        architecture=recipe.architecture,
        dataset=recipe.dataset,
        input_shape=tuple(train_set.x.shape[1:]),
        num_classes=len(train_set.classes),
        mean=recipe.mean,
        std=recipe.std,
        recipe=recipe,
        metrics={
            "clean_accuracy": accuracy(network, test_set),
            "test_samples": float(len(test_set)),
            "train_seconds": round(time.time() - started, 1),
        },
    )
    write_manifest_entry(out_dir, entry)
    return entry
