"""Neuron coverage (DeepGauge, Ma et al. 2018): how much of the model a test set exercises.

KMNCov, NBCov and SNACov compare each neuron's outputs with the range [low, high] it showed on
the profile (training) data; TKNCov counts neurons that are ever among the k most active of
their layer. All four read the cached (n, N) neuron-value matrix and work on every neuron at
once. They describe the *test set's* thoroughness, not the model's robustness: direction
``neutral``.

Registered metrics: ``kmncov``, ``nbcov``, ``snacov``, ``tkncov``.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.neuron_base import NeuronDataMetric, NeuronMetricConfig
from aisafety.evaluation.neurons import NeuronBounds
from aisafety.interfaces import NEURON_SHARE, AttackSpec, Direction, MetricValue


def covered_sections(outputs: torch.Tensor, bounds: NeuronBounds, k: int) -> torch.Tensor:
    """(N, k) bool: section i of neuron n is hit by some input.

    Section i (0-based) is [low + i d, low + (i+1) d) with d = (high - low) / k, the last one
    closed at ``high``. A neuron constant on the profile data (low == high) has k sections
    that are all the point {low}: a value equal to it covers all k.
    """
    values = outputs.double()
    low, high = bounds.low.double(), bounds.high.double()
    width = high - low
    inside = (values >= low) & (values <= high)
    scaled = (values - low) / torch.where(width > 0, width, torch.ones_like(width)) * k
    section = scaled.floor().clamp_(0, k - 1).long()
    n_neurons = values.shape[1]
    flat = (torch.arange(n_neurons) * k + section)[inside]
    covered = torch.zeros(n_neurons * k, dtype=torch.bool)
    covered[flat] = True
    covered = covered.view(n_neurons, k)
    covered[width == 0] = inside.any(0)[width == 0, None]
    return covered


def corner_neurons(outputs: torch.Tensor, bounds: NeuronBounds) -> tuple[torch.Tensor, ...]:
    """(N,) bool each: some input went above ``high`` (upper corner) / below ``low``."""
    return (outputs > bounds.high).any(0), (outputs < bounds.low).any(0)


def top_k_neurons(outputs: torch.Tensor, sizes: tuple[int, ...], k: int) -> torch.Tensor:
    """(N,) bool: the neuron is among the k largest of its layer for some input.

    Ties go to the lower neuron index (stable sort), so the result is deterministic.
    """
    hit = torch.zeros(outputs.shape[1], dtype=torch.bool)
    start = 0
    for size in sizes:  # a handful of layers; every sample and neuron of a layer at once
        layer = outputs[:, start : start + size]
        order = torch.sort(layer, dim=1, descending=True, stable=True).indices
        hit[start + order[:, : min(k, size)].unique()] = True
        start += size
    return hit


class CoverageMetric(NeuronDataMetric):
    direction = Direction.NEUTRAL
    # A share of neurons (or of their sections), not of samples: the unit "fraction" would
    # give it a binomial interval over the images (intervals.is_rate), which it has not.
    unit = NEURON_SHARE
    category = "data"

    def bounds_and_outputs(self, ctx, attack, eps) -> tuple[NeuronBounds, torch.Tensor]:
        layers, outputs = self.outputs(ctx, attack, eps)
        return ctx.neurons.bounds(layers), outputs

    def coverage(self, value: torch.Tensor, ctx, attack, eps, bounds: NeuronBounds, n: int):
        return self.value(
            value, n, attack, eps, neurons=bounds.n_neurons, profile_samples=bounds.n_profile
        )


class KMNConfig(NeuronMetricConfig):
    k: int = Field(default=10, gt=0)  # sections per neuron range


class KMultisectionNeuronCoverage(CoverageMetric):
    """AISafety eq. 1 / DeepGauge KMNC: covered sections over k x |N|."""

    name = "kmncov"
    description = "k-multisection neuron coverage: share of the k sections of each neuron's training range that the inputs hit"  # noqa: E501
    Config = KMNConfig

    def measure(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> list[MetricValue]:
        bounds, outputs = self.bounds_and_outputs(ctx, attack, eps)
        covered = covered_sections(outputs, bounds, self.config.k)
        return [self.coverage(covered.double().mean(), ctx, attack, eps, bounds, len(outputs))]


class NeuronBoundaryCoverage(CoverageMetric):
    """AISafety eq. 2 / DeepGauge NBC: (upper + lower corner neurons) / (2 |N|)."""

    name = "nbcov"
    description = "Neuron boundary coverage: share of neuron corner cases (above or below the training range) the inputs hit"  # noqa: E501

    def measure(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> list[MetricValue]:
        bounds, outputs = self.bounds_and_outputs(ctx, attack, eps)
        upper, lower = corner_neurons(outputs, bounds)
        value = (upper.sum() + lower.sum()).double() / (2 * bounds.n_neurons)
        return [self.coverage(value, ctx, attack, eps, bounds, len(outputs))]


class StrongNeuronActivationCoverage(CoverageMetric):
    """AISafety eq. 3 / DeepGauge SNAC: upper corner neurons / |N|."""

    name = "snacov"
    description = "Strong neuron activation coverage: share of neurons the inputs drive above their training maximum"  # noqa: E501

    def measure(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> list[MetricValue]:
        bounds, outputs = self.bounds_and_outputs(ctx, attack, eps)
        upper, _ = corner_neurons(outputs, bounds)
        return [self.coverage(upper.double().mean(), ctx, attack, eps, bounds, len(outputs))]


class TKNConfig(NeuronMetricConfig):
    k: int = Field(default=2, gt=0)  # the k most active neurons of each layer


class TopKNeuronCoverage(CoverageMetric):
    """DeepGauge TKNC (no formula in the AISafety paper): |union over inputs and layers of the
    layer's top-k neurons| / |N|. Needs no bounds, hence no profile data."""

    name = "tkncov"
    description = "Top-k neuron coverage: share of neurons that are among the k most active of their layer for some input"  # noqa: E501
    Config = TKNConfig

    def measure(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> list[MetricValue]:
        layers, outputs = self.outputs(ctx, attack, eps)
        hit = top_k_neurons(outputs, ctx.neurons.sizes(layers), self.config.k)
        return [self.value(hit.double().mean(), len(outputs), attack, eps, neurons=len(hit))]
