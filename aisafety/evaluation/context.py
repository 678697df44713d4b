"""The evaluation context: builds each artifact once and hands it to every metric.

Metrics never run attacks themselves; they ask the context for ``adversarial(spec, eps)``
and get the cached result, so twenty metrics over one PGD spec cost one PGD run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from functools import cached_property
from typing import Any

import torch

from aisafety.attack.base import Attack
from aisafety.attack.result import AttackResult
from aisafety.database.datasets.base import LoadedDataset
from aisafety.evaluation.corrupted import (
    SequencePredictions,
    corrupted_predictions,
    sample_subset,
    sequence_predictions,
)
from aisafety.evaluation.neurons import NeuronArtifacts
from aisafety.evaluation.reference import ReferenceOutputs, missing_reference
from aisafety.interfaces import AttackSpec, CorruptionsSpec
from aisafety.prediction.base import Predictor


class EvaluationContext:
    """One model on one dataset; artifacts computed lazily and cached."""

    def __init__(
        self,
        predictor: Predictor,
        data: LoadedDataset,
        make_attack: Callable[[AttackSpec], Attack],
        batch_size: int = 128,
        quiet: bool = True,
        reference: Predictor | None = None,
        seed: int = 0,
        load_profile: Callable[[], LoadedDataset] | None = None,
        corruptions: CorruptionsSpec | None = None,
    ):
        self.predictor = predictor
        self.data = data
        self.make_attack = make_attack
        self.batch_size = batch_size
        self.quiet = quiet
        self.load_profile = load_profile  # the data neuron bounds come from, read on demand
        self._adversarial: dict[tuple[str, float], AttackResult] = {}
        self.reference_predictor = reference  # the baseline of defense-cost metrics and mFR
        self.seed = seed
        self._corrupted: dict[tuple[str, int, int | None], torch.Tensor] = {}
        self._sequences: dict[tuple[str, int, int | None], SequencePredictions] = {}
        self.attack_runs: Counter[tuple[str, float]] = Counter()
        self._artifacts: dict[Hashable, Any] = {}
        # the plan's corruptions: section: which corrupted sets, from which severity table
        self.corruptions = corruptions or CorruptionsSpec()

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()`` once per ``key``: a costly artifact several metrics share (CERTIFY)."""
        if key not in self._artifacts:
            self._artifacts[key] = build()
        return self._artifacts[key]

    @property
    def x(self) -> torch.Tensor:
        return self.data.x

    @property
    def y(self) -> torch.Tensor:
        return self.data.y

    def _batches(self) -> list[slice]:
        n = len(self.data)
        return [slice(i, min(i + self.batch_size, n)) for i in range(0, n, self.batch_size)]

    @cached_property
    def clean_logits(self) -> torch.Tensor:
        with torch.inference_mode():
            parts = [
                self.predictor.logits(self.x[b].to(self.predictor.device)) for b in self._batches()
            ]
        return torch.cat(parts).cpu()

    @cached_property
    def clean_probs(self) -> torch.Tensor:
        return torch.softmax(self.clean_logits, dim=1)

    @cached_property
    def clean_correct(self) -> torch.Tensor:
        return self.clean_logits.argmax(1) == self.y

    @cached_property
    def neurons(self) -> NeuronArtifacts:
        """Neuron outputs, training-data bounds and deviations (``evaluation/neurons.py``)."""
        return NeuronArtifacts(self.predictor, self.batch_size, self.load_profile)

    def neuron_outputs(
        self, layers: tuple[str, ...], attack: AttackSpec | None = None, eps: float | None = None
    ) -> torch.Tensor:
        """(n, N) neuron values on the clean data, or on ``attack``'s examples at ``eps``."""
        if attack is None:
            return self.neurons.outputs(layers, "clean", self.x)
        x_adv = self.adversarial(attack, eps).x_adv
        return self.neurons.outputs(layers, (attack.key(), float(eps)), x_adv)

    @cached_property
    def reference(self) -> ReferenceOutputs:
        """The reference model's clean outputs, computed once (``reference_model`` in a plan)."""
        if self.reference_predictor is None:
            raise missing_reference("this metric")
        return ReferenceOutputs.compute(self.reference_predictor, self.x, self.batch_size)

    def corrupted(self, name: str, severity: int, samples: int | None = None) -> torch.Tensor:
        """The model's predicted labels on the data (or on ``subset(samples)`` of it) corrupted
        by ``name`` at ``severity``."""
        key = (name, int(severity), samples)
        if key not in self._corrupted:
            self._corrupted[key] = corrupted_predictions(
                self.predictor, self.x[self.subset(samples)], name, severity, self.seed,
                self.batch_size, self.corruptions.table,
            )  # fmt: skip
        return self._corrupted[key]

    def flip_sequence(
        self, name: str, n_frames: int, samples: int | None = None
    ) -> SequencePredictions:
        """Per-frame labels on perturbation sequence ``name`` of the data (or of
        ``subset(samples)``): the model's and the reference's, in one pass."""
        key = (name, int(n_frames), samples)
        if key not in self._sequences:
            models = [self.predictor]
            if self.reference_predictor is not None:
                models.append(self.reference_predictor)
            labels = sequence_predictions(
                models, self.x[self.subset(samples)], name, n_frames, self.seed, self.batch_size
            )
            self._sequences[key] = SequencePredictions(name, labels[0], (labels[1:] or [None])[0])
        return self._sequences[key]

    def subset(self, samples: int | None) -> torch.Tensor:
        """Indices of at most ``samples`` samples, drawn with the plan's seed (sorted)."""
        return sample_subset(len(self.y), samples, self.seed)

    def adversarial(self, spec: AttackSpec, eps: float) -> AttackResult:
        """The attack's result over the whole dataset at budget ``eps`` (computed once)."""
        key = (spec.key(), float(eps))
        if key not in self._adversarial:
            attack = self.make_attack(spec)
            result = attack(
                self.predictor,
                self.x,
                self.y,
                eps,
                chunk_size=self.batch_size,
                progress=not self.quiet,
                clean_logits=self.clean_logits,
            )
            self._adversarial[key] = self._to_cpu(result)
            self.attack_runs[key] += 1
        return self._adversarial[key]

    @staticmethod
    def _to_cpu(result: AttackResult) -> AttackResult:
        for name, value in vars(result).items():
            if isinstance(value, torch.Tensor):
                setattr(result, name, value.detach().cpu())
        return result
