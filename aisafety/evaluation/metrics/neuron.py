"""Model-structure metrics over hidden neurons: sensitivity and uncertainty, one row per layer.

A neuron is a linear unit, a convolution channel or a token layer's hidden unit
(``evaluation/neurons.py``); each metric gives one ``MetricValue`` per watched layer,
labelled ``<name>(layer=<module>)``, whose value is the mean over that layer's neurons (the
AISafety paper's Fig. 7 reports these means).

Registered metrics: ``neuron-sensitivity``, ``neuron-uncertainty``.
"""

from __future__ import annotations

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import AttackMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.neuron_base import NeuronDataMetric, NeuronMetric
from aisafety.interfaces import AttackSpec, Direction, MetricValue


class NeuronSensitivityConfig(PluginConfig):
    layers: tuple[str, ...] | None = None  # None: the model's activation modules


class NeuronSensitivity(NeuronMetric, AttackMetric):
    """AISafety eq. 22 (Zhang et al. 2021): for neuron m of layer l,
    sigma = (1/n) sum_i ||f_lm(x_i) - f_lm(x'_i)||_1 / dim(f_lm(x_i)) over all n clean /
    adversarial pairs; a robust model keeps its hidden representation under attack."""

    name = "neuron-sensitivity"
    description = (
        "Per layer: mean absolute change of each neuron's output between clean and "
        "adversarial inputs, averaged over the layer's neurons"
    )
    direction = Direction.LOWER
    unit = "activation"
    Config = NeuronSensitivityConfig  # type: ignore[assignment]

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        layers = self.layers(ctx)
        result = ctx.adversarial(attack, eps)
        deviations = ctx.neurons.deviation(
            layers, (attack.key(), float(eps)), result.x, result.x_adv
        )
        values = []
        for layer, deviation in zip(layers, deviations, strict=True):
            per_neuron = deviation.double().mean(0)
            values.append(
                self.layer_value(
                    layer,
                    per_neuron.mean(),
                    len(deviation),
                    attack,
                    eps,
                    neurons=len(per_neuron),
                    max_neuron=float(per_neuron.max()),
                )
            )
        return values


class NeuronUncertainty(NeuronDataMetric):
    """AISafety eq. 23, U(f_lm) = (1/n) sum_i variance(f_lm(x_i)), read as the variance of
    each neuron's value over the n inputs (docs/metrics.md says why)."""

    name = "neuron-uncertainty"
    description = (
        "Per layer: variance of each neuron's output over the inputs, averaged over the "
        "layer's neurons"
    )
    direction = Direction.LOWER
    unit = "activation^2"

    def measure(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> list[MetricValue]:
        layers, outputs = self.outputs(ctx, attack, eps)
        per_layer = outputs.double().split(ctx.neurons.sizes(layers), dim=1)
        values = []
        for layer, neurons in zip(layers, per_layer, strict=True):
            variance = neurons.var(0, unbiased=False)
            values.append(
                self.layer_value(
                    layer, variance.mean(), len(neurons), attack, eps, neurons=len(variance)
                )
            )
        return values
