"""The evaluation context: builds each artifact once and hands it to every metric.

Metrics never run attacks themselves; they ask the context for ``adversarial(spec, eps)``
and get the cached result, so twenty metrics over one PGD spec cost one PGD run.
"""

from __future__ import annotations

import copy
import hashlib
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
from aisafety.evaluation.reference import (
    ReferenceOutputs,
    check_reference_classes,
    missing_reference,
)
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
        shard_size: int | None = None,
    ):
        self.predictor = predictor
        self.data = data
        self.make_attack = make_attack
        self.batch_size = batch_size
        self.quiet = quiet
        self.load_profile = load_profile  # the data neuron bounds come from, read on demand
        self._adversarial: dict[tuple[str, float], AttackResult] = {}
        if reference is not None:  # before any work: compared class by class
            check_reference_classes(predictor, reference)
        self.reference_predictor = reference  # the baseline of defense-cost metrics and mFR
        self.seed = seed
        self._corrupted: dict[tuple[str, int, int | None], torch.Tensor] = {}
        self._sequences: dict[tuple[str, int, int | None], SequencePredictions] = {}
        self.attack_runs: Counter[tuple[str, float]] = Counter()
        self._artifacts: dict[Hashable, Any] = {}
        # the plan's corruptions: section: which corrupted sets, from which severity table
        self.corruptions = corruptions or CorruptionsSpec()
        self.shard_size = shard_size  # attack in shards of this many samples (scale-out)
        # Where attack results computed elsewhere come from (the other units' tasks on Ray):
        # asked before an attack runs here; None from it means "run it here".
        self.attack_source: Callable[[AttackSpec, float], AttackResult | None] | None = None

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

    def use_clean_logits(self, logits: torch.Tensor) -> None:
        """Take the clean logits computed elsewhere (once per cluster, from Ray's object
        store) instead of computing them here."""
        if logits.shape != (len(self.data), *logits.shape[1:]):
            raise ValueError(f"clean logits of shape {tuple(logits.shape)} for {len(self.data)}")
        self.__dict__["clean_logits"] = logits

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
        """The attack's result over the whole dataset at budget ``eps`` (computed once; shard
        by shard when the plan sets ``shard_size``)."""
        key = (spec.key(), float(eps))
        if key not in self._adversarial and self.attack_source is not None:
            found = self.attack_source(spec, eps)
            if found is not None:
                self.set_adversarial(spec, eps, found)
        if key not in self._adversarial:
            if self.shard_size is None:
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
            else:
                parts = [self.attack_shard(spec, eps, i) for i in range(len(self.shards()))]
                result = AttackResult.concat(parts)
            self.set_adversarial(spec, eps, result)
            self.attack_runs[key] += 1
        return self._adversarial[key]

    def set_adversarial(self, spec: AttackSpec, eps: float, result: AttackResult) -> None:
        """The attack's result at ``eps``, computed elsewhere (its shards, on Ray workers)."""
        if len(result.y) != len(self.data):
            raise ValueError(
                f"{spec.label} eps={eps:g}: {len(result.y)} results for {len(self.data)}"
            )
        key = (spec.key(), float(eps))
        self._adversarial[key] = self._to_cpu(result)

    def forget_cached(self) -> None:
        """Drop every computed artifact (after a plugin changed shared state,
        ``evaluation/integrity.py``): the next unit computes afresh what it reads."""
        for name in ("clean_logits", "clean_probs", "clean_correct", "neurons", "reference"):
            self.__dict__.pop(name, None)
        for cache in (self._adversarial, self._corrupted, self._sequences, self._artifacts):
            cache.clear()

    def forget_adversarial(self, spec: AttackSpec, eps: float) -> None:
        """Free an attack result no later unit of this process reads (Ray workers)."""
        self._adversarial.pop((spec.key(), float(eps)), None)

    def shards(self) -> list[slice]:
        """The samples of each shard (``shard_size`` consecutive samples; one shard if None)."""
        n, size = len(self.data), self.shard_size or max(len(self.data), 1)
        return [slice(i, min(i + size, n)) for i in range(0, n, size)] or [slice(0, 0)]

    def attack_shard(self, spec: AttackSpec, eps: float, index: int) -> AttackResult:
        """The attack on shard ``index`` alone, with that shard's own random stream: the same
        draws wherever the shard runs (a Ray worker or this process)."""
        rows = self.shards()[index]
        attack = shard_attack(self.make_attack(spec), index)
        result = attack(
            self.predictor,
            self.x[rows],
            self.y[rows],
            eps,
            chunk_size=self.batch_size,
            progress=not self.quiet,
            clean_logits=self.clean_logits[rows],
        )
        return self._to_cpu(result)

    @staticmethod
    def _to_cpu(result: AttackResult) -> AttackResult:
        for name, value in vars(result).items():
            if isinstance(value, torch.Tensor):
                setattr(result, name, value.detach().cpu())
        return result


def shard_attack(attack: Attack, index: int) -> Attack:
    """``attack`` with the random stream of shard ``index``: shard 0 keeps the attack's seed
    (one shard draws what the unsharded attack draws), shard i > 0 a seed derived from the
    attack's and i, so no two shards repeat each other's random starts. ``random_seed`` is
    where every attack's call takes its stream's seed (the transfer attack's included)."""
    if index == 0:
        return attack
    text = f"{attack.random_seed()}:{index}".encode()
    seed = int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1
    shard = copy.copy(attack)
    shard.random_seed = lambda: seed  # type: ignore[method-assign]
    return shard
