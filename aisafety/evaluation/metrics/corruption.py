"""Corruption robustness: mCE, RmCE (corrupted sets) and mFR, mFP (perturbation sequences).

After Hendrycks & Dietterich (ICLR 2019), in the unnormalised form the AISafety paper uses
(eqs. 12-14): no AlexNet baseline for mCE and RmCE. mFR divides by the flip probability of the
plan's reference model, as eq. 14's FP^base asks. Every corrupted set and sequence is an
artifact of the context, so mCE and RmCE share the 19 x 5 sets and mFR and mFP the sequences.

Registered metrics: ``mce``, ``mfp``, ``mfr``, ``rmce``.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
from pydantic import Field, field_validator

from aisafety.config_base import PluginConfig
from aisafety.corruption import CORRUPTIONS, SEQUENCES, SEVERITIES
from aisafety.errors import UnknownNameError
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.corrupted import flip_probability
from aisafety.interfaces import Capability, Direction, MetricValue


class CorruptionConfig(PluginConfig):
    """Deprecated: the plan's ``corruptions:`` section says which sets to evaluate. Given here,
    a field still overrides the section for this metric (with a warning)."""

    corruptions: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="deprecated: the plan's corruptions.names"
    )
    severities: tuple[int, ...] | None = Field(
        default=None, min_length=1, description="deprecated: the plan's corruptions.severities"
    )
    samples: int | None = Field(
        default=None, gt=0, description="deprecated: the plan's corruptions.samples"
    )

    @field_validator("corruptions")
    @classmethod
    def _known_corruptions(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in names or ():
            if name not in CORRUPTIONS:
                raise UnknownNameError("corruption", name, CORRUPTIONS)
        return names

    @field_validator("severities")
    @classmethod
    def _known_severities(cls, values: tuple[int, ...] | None) -> tuple[int, ...] | None:
        bad = [s for s in values or () if s not in SEVERITIES]
        if bad:
            raise ValueError(f"severities {bad} are not in 1..5")
        return values

    def model_post_init(self, context) -> None:
        given = {"corruptions": "names", "severities": "severities", "samples": "samples"}
        moved = [f"{k} -> corruptions.{v}" for k, v in given.items() if k in self.model_fields_set]
        if moved:
            warnings.warn(
                "mce/rmce config keys are deprecated: put them in the plan's corruptions:"
                f" section ({', '.join(moved)}); docs/configuration.md",
                FutureWarning,
                stacklevel=2,
            )


class CorruptionSets(NamedTuple):
    """What an mce/rmce computation covers: the metric's deprecated overrides, else the
    plan's corruptions: section."""

    names: tuple[str, ...]
    severities: tuple[int, ...]
    samples: int | None


def corruption_sets(ctx: EvaluationContext, config: CorruptionConfig) -> CorruptionSets:
    plan = ctx.corruptions
    names = config.corruptions or plan.names or tuple(CORRUPTIONS)
    for name in names:
        if name not in CORRUPTIONS:
            raise UnknownNameError("corruption", name, CORRUPTIONS)
    severities = config.severities or plan.severities
    samples = config.samples if "samples" in config.model_fields_set else plan.samples
    return CorruptionSets(tuple(names), tuple(severities), samples)


def corruption_errors(ctx: EvaluationContext, sets: CorruptionSets) -> torch.Tensor:
    """E_{s,c}: the error rate per corruption (rows) and severity (columns)."""
    y = ctx.y[ctx.subset(sets.samples)]
    return torch.tensor(
        [
            [
                float((ctx.corrupted(c, s, sets.samples) != y).double().mean())
                for s in sets.severities
            ]
            for c in sets.names
        ],
        dtype=torch.float64,
    )


def clean_error(ctx: EvaluationContext, samples: int | None) -> float:
    return 1.0 - float(ctx.clean_correct[ctx.subset(samples)].double().mean())


class MeanCorruptionError(CleanMetric):
    """AISafety eq. 12: CE_c = sum over severities of E_{s,c}; mCE = mean over corruptions."""

    name = "mce"
    description = "Mean over corruptions of the error rate summed over severities (unnormalised)"
    direction = Direction.LOWER
    unit = "error x severities"
    requires = Capability.LABELS
    Config = CorruptionConfig

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        sets = corruption_sets(ctx, self.config)
        errors = corruption_errors(ctx, sets)
        per_corruption = self.per_corruption(ctx, errors, sets.samples)
        return [
            self.value(
                per_corruption.mean(),
                len(ctx.subset(sets.samples)),
                per_corruption=dict(zip(sets.names, per_corruption.tolist(), strict=True)),
                severities=list(sets.severities),
                table=ctx.corruptions.table,
                # E_{s,c} itself, for the report's error-per-type-and-severity plot
                errors=dict(zip(sets.names, errors.tolist(), strict=True)),
            )
        ]

    def per_corruption(
        self, ctx: EvaluationContext, errors: torch.Tensor, samples: int | None
    ) -> torch.Tensor:
        return errors.sum(1)


class RelativeMeanCorruptionError(MeanCorruptionError):
    """Hendrycks & Dietterich's relative CE, unnormalised: sum over severities of
    (E_{s,c} - E_clean). AISafety eq. 13 subtracts E_clean once, which contradicts its own
    text (the gap vanishes for a model that withstands corruption); we follow the source."""

    name = "rmce"
    description = "Mean over corruptions of the summed increase of error over the clean error"

    def per_corruption(
        self, ctx: EvaluationContext, errors: torch.Tensor, samples: int | None
    ) -> torch.Tensor:
        return (errors - clean_error(ctx, samples)).sum(1)


class SequenceConfig(PluginConfig):
    sequences: tuple[str, ...] = Field(
        default=tuple(SEQUENCES), min_length=1, description="sequence names; default all 11"
    )
    n_frames: int = Field(default=31, ge=2, description="frames per sequence (CIFAR-10-P: 31)")
    samples: int | None = Field(default=None, gt=0, description="at most this many samples")

    @field_validator("sequences")
    @classmethod
    def _known_sequences(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if name not in SEQUENCES:
                raise UnknownNameError("perturbation sequence", name, SEQUENCES)
        return names


class MeanFlipProbability(CleanMetric):
    """Eq. 14's flip probability FP_c, averaged over sequences, without a baseline."""

    name = "mfp"
    description = "Mean over perturbation sequences of the probability the prediction flips"
    direction = Direction.LOWER
    unit = "probability"
    requires = Capability.LABELS
    Config = SequenceConfig

    def flip_probabilities(self, ctx: EvaluationContext, reference: bool) -> dict[str, float]:
        out = {}
        for name in self.config.sequences:
            labels = ctx.flip_sequence(name, self.config.n_frames, self.config.samples)
            seq = labels.reference if reference else labels.model
            out[name] = flip_probability(seq, labels.compares_to_first_frame)
        return out

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        fp = self.flip_probabilities(ctx, reference=False)
        value = sum(fp.values()) / len(fp)
        n = len(ctx.subset(self.config.samples))
        return [self.value(value, n, per_sequence=fp, n_frames=self.config.n_frames)]


class MeanFlipRate(MeanFlipProbability):
    """Eq. 14: FR_c = FP_c / FP_c^base with the reference model as the base; mFR = mean FR_c.

    A sequence on which the reference never flips has no finite ratio; it is left out and
    named in ``details['undefined']`` (NaN if no sequence is left).
    """

    name = "mfr"
    description = "Mean over sequences of the flip probability relative to the reference model's"
    direction = Direction.LOWER
    unit = "ratio"
    needs_reference = True

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        reference = ctx.reference.name  # first: a clear error if the plan has no reference
        fp = self.flip_probabilities(ctx, reference=False)
        base = self.flip_probabilities(ctx, reference=True)
        rates = {c: fp[c] / base[c] for c in fp if base[c] > 0}
        value = sum(rates.values()) / len(rates) if rates else math.nan
        return [
            self.value(
                value,
                len(ctx.subset(self.config.samples)),
                per_sequence=rates,
                undefined=[c for c in fp if c not in rates],
                reference=reference,
                n_frames=self.config.n_frames,
            )
        ]
