"""Building a zoo entry: train a recipe, measure it, write checkpoint and manifest entry.

This sits beside the zoo (``database/zoo.py``, which only reads and writes manifests and
checkpoints) but in the application layer: it resolves the recipe's training defense through
the plugin registry, trains it with the defense module's loop
(``aisafety.defense.training.loop``) and measures robustness with the platform's own PGD and
IBP certification.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import (
    TrainingRecipe,
    ZooEntry,
    list_models,
    load_zoo_state,
    sha256_bytes,
    write_manifest_entry,
)
from aisafety.defense.training.base import TrainingDefense
from aisafety.defense.training.loop import train_network
from aisafety.errors import ConfigError, IntegrityError, UnknownNameError
from aisafety.evaluation.metrics.certified import ibp_certified_mask
from aisafety.plugins import Registry, default_registry
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import Normalize, TorchPredictor

# What the manifest's robustness numbers are called: ``<kind>_accuracy_eps<eps>``, one key
# per l-inf budget (``pgd40_robust_accuracy_eps0.3``); ``zoo train --recipe-of`` reads the
# budgets back from them to reproduce an entry.
ROBUST, CERTIFIED = "pgd40_robust", "ibp_certified"


def budget_key(kind: str, eps: float) -> str:
    return f"{kind}_accuracy_eps{eps:g}"


def recorded_budgets(entry: ZooEntry, kind: str) -> list[float]:
    """The budgets ``kind`` (``ROBUST``, ``CERTIFIED``) was measured at for ``entry``."""
    prefix = f"{kind}_accuracy_eps"
    return [float(key.removeprefix(prefix)) for key in entry.metrics if key.startswith(prefix)]


def recorded_robust_every(entry: ZooEntry) -> int:
    """Every how many of the robustness images ``entry``'s robustness was measured on."""
    return int(entry.metrics.get("robust_every", 1))


def zoo_entry(name: str) -> ZooEntry:
    """The zoo entry ``name`` (UnknownNameError naming the entries there)."""
    entries = list_models()
    if name not in entries:
        raise UnknownNameError("zoo model", name, sorted(entries))
    return entries[name][0]


def accuracy(network: nn.Module, data: LoadedDataset, batch_size: int = 1000) -> float:
    network.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(data), batch_size):
            logits = network(data.x[start : start + batch_size])
            correct += int((logits.argmax(1) == data.y[start : start + batch_size]).sum())
    return correct / len(data)


def pgd_robust_accuracy(
    predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int = 40
) -> float:
    """Accuracy under the platform's l-inf PGD (random start, step 2.5 eps / steps, seed 0)."""
    return PGDLinf({"steps": steps})(predictor, x, y, eps).robust_accuracy


# Training defenses whose models are built to be certified: their entries record IBP too.
CERTIFIED_TRAINING = ("ibp", "crown-ibp")


def attack_robust_accuracy(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    attack: str,
    config: dict[str, Any],
    registry: Registry | None = None,
) -> float:
    """Accuracy under the registered ``attack`` (built with ``config``) at budget ``eps``."""
    registry = registry or default_registry()
    return registry.create("attack", attack, config)(predictor, x, y, eps).robust_accuracy


def robustness_metrics(
    predictor: Predictor,
    data: LoadedDataset,
    robust_eps: Sequence[float],
    certified_eps: Sequence[float] = (),
    defense: TrainingDefense | None = None,
) -> dict[str, float]:
    """The manifest's robustness numbers on ``data`` (the fixed 1,000-image subset of
    ``robustness_subset``): PGD-40 robust accuracy at each l-inf budget of ``robust_eps``,
    IBP-certified accuracy at each of ``certified_eps``, and where ``defense`` has an adaptive
    attack (``TrainingDefense.adaptive_correct``) the accuracy on the samples that survive
    both it and PGD-40 (``adaptive_robust_accuracy_eps*``); there too the robust accuracy
    under each of the defense's ``evaluation_attacks`` (``<attack>_robust_accuracy_eps*``)."""
    metrics = {"robust_samples": float(len(data))} if robust_eps or certified_eps else {}
    for eps in robust_eps:
        survived = PGDLinf({"steps": 40})(predictor, data.x, data.y, eps).adv_pred == data.y
        metrics[budget_key(ROBUST, eps)] = survived.double().mean().item()
        adaptive = None if defense is None else defense.adaptive_correct(
            predictor, data.x, data.y, eps
        )  # fmt: skip
        if adaptive is not None:
            worst = survived & adaptive
            metrics[budget_key("adaptive_robust", eps)] = worst.double().mean().item()
        for attack, config in [] if defense is None else defense.evaluation_attacks():
            metrics[budget_key(f"{attack}_robust", eps)] = attack_robust_accuracy(
                predictor, data.x, data.y, eps, attack, config
            )
    for eps in certified_eps:
        mask = ibp_certified_mask(predictor.network, data.x, data.y, eps)
        metrics[budget_key(CERTIFIED, eps)] = mask.double().mean().item()
    return metrics


def robustness_subset(dataset: str, test_set: LoadedDataset) -> LoadedDataset:
    """The 1,000 test images robustness is measured on: the shipped MNIST subset for MNIST
    (what ``aisafety evaluate`` attacks), else a class-balanced 1,000 of the test set."""
    if dataset == "mnist":
        return EmbeddedMnist().load(None, "test")
    return test_set.balanced_subset(min(1000, len(test_set)), 0)


def training_eps(recipe: TrainingRecipe) -> list[float]:
    """The budget a recipe trains for (its defense's ``eps``), the default robustness budget."""
    eps = recipe.defense_config.get("eps")
    return [float(eps)] if isinstance(eps, int | float) and eps > 0 else []


def training_defense(
    name: str, config: dict[str, Any], registry: Registry | None = None
) -> TrainingDefense:
    """The registered training defense ``name`` built with ``config``."""
    registry = registry or default_registry()
    return registry.create("training_defense", name, config)


def initial_weights(recipe: TrainingRecipe) -> dict[str, torch.Tensor]:
    """The zoo weights a fine-tuning recipe starts from, refused if they are not the pinned ones."""
    entry, state = load_zoo_state(str(recipe.init_from))
    if entry.architecture != recipe.architecture:
        raise ConfigError(
            f"init_from {recipe.init_from!r} is a {entry.architecture!r} model, the recipe "
            f"trains {recipe.architecture!r}; pick an entry of the same architecture"
        )
    if recipe.init_sha256 is not None and entry.sha256 != recipe.init_sha256:
        raise IntegrityError(
            f"init_from {recipe.init_from!r} has sha256 {entry.sha256[:12]}…, the recipe pins "
            f"{recipe.init_sha256[:12]}…; restore that checkpoint or retrain it from its recipe"
        )
    return state


def train(
    recipe: TrainingRecipe,
    train_set: LoadedDataset,
    quiet: bool = False,
    test_set: LoadedDataset | None = None,
) -> nn.Module:
    """Train the model ``recipe`` describes on ``train_set``; returns the module."""
    return train_selected(recipe, train_set, quiet, test_set)[0]


def train_selected(
    recipe: TrainingRecipe,
    train_set: LoadedDataset,
    quiet: bool = False,
    test_set: LoadedDataset | None = None,
) -> tuple[nn.Module, dict[str, float]]:
    """``train``, also returning what a ``keep: best-test`` recipe kept, as manifest metrics:
    ``selected_epoch`` (1-based) and ``selection_score`` (its score on ``test_set``)."""
    defense = training_defense(recipe.defense, recipe.defense_config)
    initial = initial_weights(recipe) if recipe.init_from is not None else None
    module, selection = train_network(recipe, defense, train_set, initial, quiet, test_set)
    if selection is None:
        return module, {}
    return module, {"selected_epoch": selection.epoch + 1.0, "selection_score": selection.score}


def train_zoo_entry(
    name: str,
    recipe: TrainingRecipe,
    train_set: LoadedDataset,
    test_set: LoadedDataset,
    out_dir: Path,
    quiet: bool = False,
    robust_eps: Sequence[float] | None = None,
    certified_eps: Sequence[float] | None = None,
    robust_every: int = 1,
) -> ZooEntry:
    """Train, measure clean accuracy on ``test_set`` and robustness (``robustness_metrics``;
    default budgets: the training eps, certified only for certified training), write
    checkpoint + manifest entry."""
    started = time.time()
    if recipe.init_from is not None and recipe.init_sha256 is None:
        pinned = load_zoo_state(recipe.init_from)[0].sha256
        recipe = recipe.model_copy(update={"init_sha256": pinned})
    module, selection = train_selected(recipe, train_set, quiet, test_set)
    train_seconds = round(time.time() - started, 1)
    return record_zoo_entry(
        name, recipe, module, test_set, out_dir, train_seconds, robust_eps, certified_eps,
        robust_every, selection,
    )  # fmt: skip


def record_zoo_entry(
    name: str,
    recipe: TrainingRecipe,
    module: nn.Module,
    test_set: LoadedDataset,
    out_dir: Path,
    train_seconds: float,
    robust_eps: Sequence[float] | None = None,
    certified_eps: Sequence[float] | None = None,
    robust_every: int = 1,
    selection: dict[str, float] | None = None,
) -> ZooEntry:
    """Write ``module`` (trained by ``recipe``) as checkpoint + manifest entry with what it
    measures: ``train_zoo_entry``'s second half, also for a run whose measurement failed
    after its checkpoint was written. ``robust_every`` k > 1 measures robustness on every
    k-th image of the 1,000 only (for defenses whose attacks are too costly; recorded);
    ``selection`` is the kept epoch of a ``keep: best-test`` recipe (recorded)."""
    network = nn.Sequential(Normalize(recipe.mean, recipe.std), module)
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    data = buffer.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    file = f"{name}.pt"
    (out_dir / file).write_bytes(data)
    if robust_eps is None:
        robust_eps = training_eps(recipe)
    if certified_eps is None:
        certified_eps = training_eps(recipe) if recipe.defense in CERTIFIED_TRAINING else []
    predictor = TorchPredictor(
        module, test_set.x.shape[1:], len(test_set.classes), name=name,
        mean=recipe.mean, std=recipe.std,
    )  # fmt: skip
    subset = robustness_subset(recipe.dataset, test_set)
    # A weak model's accuracy on the class-balanced 1,000 can differ from the full test
    # set's by more than the shipped-zoo check allows; the check compares with this number.
    subset_clean = accuracy(network, subset)
    if robust_every > 1:
        subset = LoadedDataset(
            subset.name, subset.x[::robust_every], subset.y[::robust_every], subset.classes
        )
    robustness = robustness_metrics(
        predictor,
        subset,
        robust_eps,
        certified_eps,
        training_defense(recipe.defense, recipe.defense_config),
    )
    entry = ZooEntry(
        name=name,
        file=file,
        sha256=sha256_bytes(data),
        architecture=recipe.architecture,
        dataset=recipe.dataset,
        input_shape=tuple(test_set.x.shape[1:]),
        num_classes=len(test_set.classes),
        mean=recipe.mean,
        std=recipe.std,
        recipe=recipe,
        metrics={
            "clean_accuracy": accuracy(network, test_set),
            "test_samples": float(len(test_set)),
            "subset_clean_accuracy": subset_clean,
            **robustness,
            **({"robust_every": float(robust_every)} if robust_every > 1 else {}),
            **(selection or {}),
            "train_seconds": train_seconds,
        },
    )
    write_manifest_entry(out_dir, entry)
    return entry
