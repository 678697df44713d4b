"""What the neuron metrics (coverage, sensitivity, uncertainty) have in common.

They read activations (``Capability.ACTIVATIONS``), take the layers to watch from their
config (default: the model's activation modules, ``evaluation/neurons.py``) and run either on
each attack's adversarial examples (the paper's tables) or once on the clean data.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import Metric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import AttackSpec, Capability, MetricValue


class NeuronMetricConfig(PluginConfig):
    # Module names as ``Predictor.layer_names()`` lists them; None: the activation modules.
    layers: tuple[str, ...] | None = None
    # 'adversarial': one value per attack and budget, on its examples; 'clean': the test data.
    data: Literal["adversarial", "clean"] = "adversarial"


class NeuronMetric(Metric):
    requires = Capability.ACTIVATIONS
    category = "structure"
    per_attack = True
    Config = NeuronMetricConfig

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        super().__init__(config, **overrides)
        # Instance-level: the runner asks each metric object whether it reads an attack.
        data = getattr(self.config, "data", "adversarial")
        self.per_attack = data == "adversarial"  # type: ignore[misc]

    def layers(self, ctx: EvaluationContext) -> tuple[str, ...]:
        return ctx.neurons.layers(self.config.layers)

    def outputs(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> tuple[tuple[str, ...], torch.Tensor]:
        """The watched layers and the (n, N) neuron values of the data this metric reads."""
        layers = self.layers(ctx)
        if self.per_attack:
            return layers, ctx.neuron_outputs(layers, attack, eps)
        return layers, ctx.neuron_outputs(layers)

    def layer_value(
        self,
        layer: str,
        value: float,
        n_samples: int,
        attack: AttackSpec | None,
        eps: float | None,
        **details: Any,
    ) -> MetricValue:
        """One layer's value, labelled e.g. ``neuron-sensitivity(layer=4)``: one row per layer.

        The watched-layer list stays out of the label: a layer's value does not depend on it.
        """
        record = self.value(value, n_samples, attack, eps, layer=layer, **details)
        settings = self.config.model_dump(exclude_defaults=True, exclude={"layers"})
        settings["layer"] = layer
        label = f"{self.name}({','.join(f'{k}={v}' for k, v in settings.items())})"
        return record.model_copy(update={"metric": label})
