"""Training defenses are registered through their own hook, ``aisafety_training_defenses``."""

from __future__ import annotations

import types

import pytest
import torch.nn.functional as F

from aisafety.defense.bit_depth import BitDepthReduction
from aisafety.defense.training.base import TrainingDefense
from aisafety.errors import ConfigError
from aisafety.hookspecs import hookimpl
from aisafety.plugins import build_registry
from aisafety.zoo_build import training_defense


class LabelSmoothingTraining(TrainingDefense):
    name = "label-smoothing"
    description = "cross-entropy against labels smoothed by 0.1"

    def loss(self, network, x, y, step):
        return F.cross_entropy(network(x), y, label_smoothing=0.1)


def _plugin(**hooks) -> types.ModuleType:
    module = types.ModuleType("training_plugin")
    for hook, result in hooks.items():
        setattr(module, hook, hookimpl((lambda r: lambda: r)(result)))
    return module


def test_a_plugin_training_defense_is_registered_and_built_by_name():
    plugin = _plugin(aisafety_training_defenses=[LabelSmoothingTraining])
    registry = build_registry(extra_plugins=[("smoothing", plugin)])
    assert "label-smoothing" in registry.names("training_defense")
    assert "label-smoothing" not in registry.names("defense")
    assert registry.sources["training_defense"]["label-smoothing"] == "smoothing"
    built = training_defense("label-smoothing", {}, registry)
    assert isinstance(built, LabelSmoothingTraining)
    assert "pgd-at" in registry.names("training_defense")  # the built-ins answer the hook too


def _failure(registry) -> str:
    [failure] = registry.failures
    return failure.error


def test_a_training_defense_from_the_input_defense_hook_is_refused_by_name():
    plugin = _plugin(aisafety_defenses=[LabelSmoothingTraining])
    registry = build_registry(extra_plugins=[("misfiled", plugin)])
    assert "aisafety_training_defenses" in _failure(registry)
    assert "label-smoothing" not in registry.names("defense")
    assert "label-smoothing" not in registry.names("training_defense")


def test_an_input_defense_from_the_training_hook_is_refused_by_name():
    wrong = type("Squeeze", (BitDepthReduction,), {"name": "squeeze"})
    plugin = _plugin(aisafety_training_defenses=[wrong])
    registry = build_registry(extra_plugins=[("misfiled", plugin)])
    assert "aisafety_defenses" in _failure(registry)
    assert "squeeze" not in registry.names("training_defense")


def test_input_and_training_defenses_share_one_namespace():
    clash = type("Clash", (LabelSmoothingTraining,), {"name": "bit-depth"})
    plugin = _plugin(aisafety_training_defenses=[clash])
    registry = build_registry(extra_plugins=[("clash", plugin)])
    assert "'bit-depth' is registered twice" in _failure(registry)
    assert registry.get("defense", "bit-depth") is BitDepthReduction
    assert "bit-depth" not in registry.names("training_defense")


def test_a_training_defense_named_as_an_input_defense_says_how_to_train_it():
    registry = build_registry()
    with pytest.raises(ConfigError, match="aisafety zoo train --defense trades"):
        registry.get("defense", "trades")


def test_a_training_defense_or_zoo_model_under_defenses_names_the_model_to_evaluate():
    """A researcher evaluating adversarial training writes defenses: [{name: pgd-at}] or
    [{name: mnist-cnn-pgd-at}]; the errors name the shipped model and the model: key."""
    registry = build_registry()
    with pytest.raises(ConfigError, match=r"trained with it: .*mnist-cnn-pgd-at, .*and \d+ more"):
        registry.get("defense", "pgd-at")
    with pytest.raises(
        ConfigError,
        match=r"trained with it: mnist-cnn-thermometer: evaluate one as 'model: \{name: NAME\}'",
    ):
        registry.get("defense", "thermometer")
    with pytest.raises(ConfigError, match=r"zoo model \(trained with 'pgd-at'\), not an input"):
        registry.get("defense", "mnist-cnn-pgd-at")
