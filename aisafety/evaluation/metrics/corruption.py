"""Corruption robustness: mCE, RmCE (corrupted sets) and mFR, mFP (perturbation sequences).

After Hendrycks & Dietterich (ICLR 2019), in the unnormalised form the AISafety paper uses
(eqs. 12-14): no AlexNet baseline for mCE and RmCE. mFR divides by the flip probability of the
plan's reference model, as eq. 14's FP^base asks. Every corrupted set and sequence is an
artifact of the context, so mCE and RmCE share the 19 x 5 sets and mFR and mFP the sequences.

Registered metrics: ``mce``, ``mfp``, ``mfr``, ``rmce``.
"""

from __future__ import annotations

import math

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
    corruptions: tuple[str, ...] = Field(
        default=tuple(CORRUPTIONS), min_length=1, description="corruption names; default all 19"
    )
    severities: tuple[int, ...] = Field(default=SEVERITIES, min_length=1)
    samples: int | None = Field(default=None, gt=0, description="at most this many samples")

    @field_validator("corruptions")
    @classmethod
    def _known_corruptions(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if name not in CORRUPTIONS:
                raise UnknownNameError("corruption", name, CORRUPTIONS)
        return names

    @field_validator("severities")
    @classmethod
    def _known_severities(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in values if s not in SEVERITIES]
        if bad:
            raise ValueError(f"severities {bad} are not in 1..5")
        return values


def corruption_errors(ctx: EvaluationContext, config: CorruptionConfig) -> torch.Tensor:
    """E_{s,c}: the error rate per corruption (rows) and severity (columns)."""
    y = ctx.y[ctx.subset(config.samples)]
    return torch.tensor(
        [
            [
                float((ctx.corrupted(c, s, config.samples) != y).double().mean())
                for s in config.severities
            ]
            for c in config.corruptions
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

    def compute(self, ctx: EvaluationContext) -> MetricValue:
        errors = corruption_errors(ctx, self.config)
        per_corruption = self.per_corruption(ctx, errors)
        return self.value(
            per_corruption.mean(),
            len(ctx.subset(self.config.samples)),
            per_corruption=dict(zip(self.config.corruptions, per_corruption.tolist(), strict=True)),
            severities=list(self.config.severities),
            # E_{s,c} itself, for the report's error-per-type-and-severity plot
            errors=dict(zip(self.config.corruptions, errors.tolist(), strict=True)),
        )

    def per_corruption(self, ctx: EvaluationContext, errors: torch.Tensor) -> torch.Tensor:
        return errors.sum(1)


class RelativeMeanCorruptionError(MeanCorruptionError):
    """Hendrycks & Dietterich's relative CE, unnormalised: sum over severities of
    (E_{s,c} - E_clean). AISafety eq. 13 subtracts E_clean once, which contradicts its own
    text (the gap vanishes for a model that withstands corruption); we follow the source."""

    name = "rmce"
    description = "Mean over corruptions of the summed increase of error over the clean error"

    def per_corruption(self, ctx: EvaluationContext, errors: torch.Tensor) -> torch.Tensor:
        return (errors - clean_error(ctx, self.config.samples)).sum(1)


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

    def compute(self, ctx: EvaluationContext) -> MetricValue:
        fp = self.flip_probabilities(ctx, reference=False)
        value = sum(fp.values()) / len(fp)
        n = len(ctx.subset(self.config.samples))
        return self.value(value, n, per_sequence=fp, n_frames=self.config.n_frames)


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

    def compute(self, ctx: EvaluationContext) -> MetricValue:
        reference = ctx.reference.name  # first: a clear error if the plan has no reference
        fp = self.flip_probabilities(ctx, reference=False)
        base = self.flip_probabilities(ctx, reference=True)
        rates = {c: fp[c] / base[c] for c in fp if base[c] > 0}
        value = sum(rates.values()) / len(rates) if rates else math.nan
        return self.value(
            value,
            len(ctx.subset(self.config.samples)),
            per_sequence=rates,
            undefined=[c for c in fp if c not in rates],
            reference=reference,
            n_frames=self.config.n_frames,
        )
