"""The training-defense concept: a registered class that turns a batch into a loss.

``aisafety.defense.training.loop`` owns the loop (data order, optimiser, schedule); a defense
only says what to minimise on each batch, so every defense trains, seeds and records its
recipe the same way. A defense needing a stage before the loop (distillation's teacher)
does it in ``prepare``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from aisafety.config_base import PluginConfig, build_config
from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError
from aisafety.prediction.base import Predictor


def batched_mean(
    data: LoadedDataset,
    per_sample: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batch_size: int = 1000,
) -> float:
    """Mean of a per-sample boolean measure over ``data`` in batches (gradients allowed:
    an attack inside ``per_sample`` may need them)."""
    total = 0
    for start in range(0, len(data), batch_size):
        stop = start + batch_size
        total += int(per_sample(data.x[start:stop], data.y[start:stop]).sum())
    return total / len(data)


@dataclass(frozen=True)
class TrainingStep:
    """Where training is: ``progress`` in epochs (fractional) out of ``epochs``."""

    progress: float
    epochs: int
    generator: torch.Generator


# fit(network, defense, epochs) runs the shared loop; prepare() uses it for extra stages.
FitFunction = Callable[[nn.Module, "TrainingDefense"], None]


class TrainingDefense(ABC):
    """Produces a model (with the recipe that made it) rather than wrapping one."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Config: ClassVar[type[PluginConfig]] = PluginConfig
    # What ``adaptive_correct`` runs, in words (empty: white-box PGD is the adaptive attack).
    adaptive_attack: ClassVar[str] = ""
    # The architecture the defense needs (None: any); pixel input in [0, 1] unless normalised.
    architecture: ClassVar[str | None] = None
    # What ``selection_score`` measures, in words, and whether a tie keeps the later epoch.
    selection_metric: ClassVar[str] = "clean accuracy"
    later_wins_ties: ClassVar[bool] = False

    def __init__(self, config: dict[str, Any] | None = None, *extra: Any, **overrides: Any):
        if extra or not (config is None or isinstance(config, dict)):
            raise ConfigError(
                f"defense {self.name!r} is a training defense: it produces a model instead of "
                f"wrapping one; train it with 'aisafety zoo train --defense {self.name}' and "
                "evaluate the zoo model it writes"
            )
        self.config = build_config(
            f"training defense {self.name!r}", self.Config, {**(config or {}), **overrides}
        )

    @classmethod
    def describe(cls) -> dict[str, Any]:
        fields = cls.Config.model_fields.items()
        defaults = {k: f.get_default(call_default_factory=True) for k, f in fields}
        return {
            "name": cls.name,
            "kind": "training",
            "description": cls.description,
            "config": defaults,
            "adaptive_attack": cls.adaptive_attack,
            "architecture": cls.architecture,
        }

    def prepare(self, network: nn.Module, fit: FitFunction) -> None:  # noqa: B027
        """Run any stage the main loop needs first (default: none)."""

    def adaptive_correct(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> torch.Tensor | None:
        """Per sample, whether the trained model still classifies ``x`` right under the attack
        this defense's own paper or its later break requires beyond white-box PGD (BPDA for a
        non-differentiable encoding, a transfer attack for gradient masking); None when
        white-box PGD is already that attack. The zoo records the worst case of both."""
        return None

    def evaluation_attacks(self) -> list[tuple[str, dict[str, Any]]]:
        """The attacks beyond PGD-40 a zoo entry of this defense records, as (registered
        attack, its config): its paper's threat model, or the attack that later broke it.
        Each runs at every robust budget, recorded as ``<attack>_robust_accuracy_eps<eps>``."""
        return []

    def selection_score(self, network: nn.Module, data: LoadedDataset, epoch: int) -> float | None:
        """How well the weights after ``epoch`` (0-based) do on ``data``, for a recipe that
        keeps its best epoch (``keep: best-test``); None: this epoch may not be kept. The
        default is clean accuracy, what the SoK's code keeps its clean models by."""
        with torch.no_grad():
            return batched_mean(data, lambda x, y: network(x).argmax(1) == y)

    def after_step(self, network: nn.Module) -> None:  # noqa: B027
        """Act on the weights after each optimiser step (default: nothing; Parseval's
        retraction onto orthonormal weights lives here)."""

    @abstractmethod
    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        """Scalar loss of one batch (``x`` in [0, 1]; ``network`` includes normalisation)."""
