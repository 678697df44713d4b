"""What the neuron metrics (coverage, sensitivity, uncertainty) have in common.

They read activations (``Capability.ACTIVATIONS``) and take the layers to watch from their
config (default: the model's activation modules, ``evaluation/neurons.py``). Coverage and
uncertainty run either on each attack's adversarial examples (the paper's tables) or once on
the clean data, as their ``data`` setting says: they are ``NeuronDataMetric``s, whose
constructor returns the attack form or the clean form of the metric.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal

import torch

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import AttackMetric, CleanMetric, Metric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import AttackSpec, Capability, MetricValue


class NeuronMetricConfig(PluginConfig):
    # Module names as ``Predictor.layer_names()`` lists them; None: the activation modules.
    layers: tuple[str, ...] | None = None
    # 'adversarial': one value per attack and budget, on its examples; 'clean': the test data.
    data: Literal["adversarial", "clean"] = "adversarial"


class NeuronMetric(Metric):
    """Layer selection and per-layer labels; a subclass also picks its kind."""

    requires = Capability.ACTIVATIONS
    category = "structure"
    Config = NeuronMetricConfig

    def layers(self, ctx: EvaluationContext) -> tuple[str, ...]:
        return ctx.neurons.layers(self.config.layers)

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


class NeuronDataMetric(NeuronMetric):
    """A neuron metric of either kind: ``data: adversarial`` (default) makes the constructor
    return its ``AttackMetric`` form, ``data: clean`` its ``CleanMetric`` form (as
    ``pathlib.Path()`` returns a ``PosixPath``). Both forms are instances of the class and
    call its ``measure``; a subclass implements ``measure`` only."""

    per_attack = True  # the default form, for ``describe()``

    def __new__(cls, config: dict[str, Any] | None = None, **overrides: Any):
        data = {**(config or {}), **overrides}.get("data", "adversarial")
        measured = getattr(cls, "_measured", cls)  # building a form's form: the same form
        return super().__new__(_form(measured, clean=data == "clean"))

    @abstractmethod
    def measure(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> list[MetricValue]:
        """The value on the adversarial examples of (attack, eps), or on the clean data when
        ``attack`` is None."""

    def outputs(
        self, ctx: EvaluationContext, attack: AttackSpec | None, eps: float | None
    ) -> tuple[tuple[str, ...], torch.Tensor]:
        """The watched layers and the (n, N) neuron values of the data this metric reads."""
        layers = self.layers(ctx)
        if attack is not None:
            return layers, ctx.neuron_outputs(layers, attack, eps)
        return layers, ctx.neuron_outputs(layers)


class _OnAttack(AttackMetric):
    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        return self.measure(ctx, attack, eps)  # type: ignore[attr-defined]


class _OnClean(CleanMetric):
    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        return self.measure(ctx, None, None)  # type: ignore[attr-defined]


_FORMS: dict[tuple[type, bool], type] = {}


def _form(cls: type[NeuronDataMetric], clean: bool) -> type:
    """``cls`` as a clean or an attack metric, built once per class."""
    if (cls, clean) not in _FORMS:
        kind = _OnClean if clean else _OnAttack
        suffix = "OnCleanData" if clean else "OnAttack"
        namespace = {"__module__": cls.__module__, "_measured": cls}
        form = type(f"{cls.__name__}{suffix}", (kind, cls), namespace)
        _FORMS[cls, clean] = form
    return _FORMS[cls, clean]
