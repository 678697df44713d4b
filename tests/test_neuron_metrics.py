"""Neuron sensitivity and neuron uncertainty: exact hand cases, invariants, per-layer rows.

The hand model's neurons are known functions of the pixels (a 1x1 conv whose channels are x
and 1 - x, then two linear units that copy pixels 0 and 3), and a fake attack returns
adversarial images chosen in advance, so every expected value below is worked out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.base import LoadedDataset
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.neuron import NeuronSensitivity, NeuronUncertainty
from aisafety.interfaces import AttackSpec, EvaluationPlan
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.results import ResultStore
from tests.test_metrics import FixedAttack  # adversarial images chosen in advance


def pixel_model():
    """Layer '1': channels x and 1 - x (neuron maps of 4 values); layer '4': x[0] and x[3]."""
    conv, pick, head = nn.Conv2d(1, 2, 1), nn.Linear(8, 2), nn.Linear(2, 2)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
        conv.bias.copy_(torch.tensor([0.0, 1.0]))
        pick.weight.zero_()
        pick.bias.zero_()
        pick.weight[0, 0] = pick.weight[1, 3] = 1.0
        head.weight.copy_(torch.eye(2))
        head.bias.zero_()
    module = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), pick, nn.ReLU(), head)
    return TorchPredictor(module, (1, 2, 2), 2, name="pixel-model")


CLEAN = torch.tensor([[0.2, 0.2, 0.2, 0.2], [0.5, 0.5, 0.5, 0.5]]).view(-1, 1, 2, 2)
ADV = torch.tensor([[0.3, 0.2, 0.2, 0.0], [0.5, 0.9, 0.5, 0.5]]).view(-1, 1, 2, 2)
SPEC = AttackSpec(name="fixed", eps=(1.0,))


@pytest.fixture
def ctx() -> EvaluationContext:
    data = LoadedDataset("hand", CLEAN, torch.tensor([0, 1]), ("0", "1"))
    return EvaluationContext(
        pixel_model(), data, lambda spec: FixedAttack(CLEAN, ADV), batch_size=1
    )


def by_layer(values) -> dict[str, float]:
    return {v.details["layer"]: v.value for v in values}


def test_neuron_sensitivity_by_hand(ctx):
    # |x - x'| per pixel: sample 0 (.1, 0, 0, .2), sample 1 (0, .4, 0, 0).
    # Layer '1': both channels change by the mean |dx| over the 4 positions: .075 and .1 -> .0875.
    # Layer '4': unit x0 changes .1 and 0 (mean .05), unit x3 .2 and 0 (mean .1) -> .075.
    values = NeuronSensitivity().compute(ctx, SPEC, 1.0)
    assert [v.metric for v in values] == [
        "neuron-sensitivity(layer=1)",
        "neuron-sensitivity(layer=4)",
    ]
    assert by_layer(values) == pytest.approx({"1": 0.0875, "4": 0.075}, abs=1e-7)
    assert values[1].details["max_neuron"] == pytest.approx(0.1, abs=1e-7)
    assert values[1].details["neurons"] == 2
    assert all(v.n_samples == 2 and v.attack == "fixed" and v.eps == 1.0 for v in values)


def test_neuron_sensitivity_is_zero_without_perturbation():
    data = LoadedDataset("hand", CLEAN, torch.tensor([0, 1]), ("0", "1"))
    same = EvaluationContext(pixel_model(), data, lambda spec: FixedAttack(CLEAN, CLEAN))
    assert all(v.value == 0.0 for v in NeuronSensitivity().compute(same, SPEC, 1.0))


def test_neuron_uncertainty_by_hand(ctx):
    # Adversarial neuron values (mean, 1 - mean, x0, x3): (.175, .825, .3, 0), (.6, .4, .5, .5).
    # Population variance over the 2 inputs: mean and 1 - mean .2125^2; x0 .01; x3 .0625.
    values = NeuronUncertainty().compute(ctx, SPEC, 1.0)
    assert by_layer(values) == pytest.approx({"1": 0.2125**2, "4": (0.01 + 0.0625) / 2}, abs=1e-7)
    # Clean: every neuron takes .2/.5 or .8/.5: variance .15^2 everywhere.
    clean = NeuronUncertainty(data="clean").compute(ctx)
    assert clean[0].metric == "neuron-uncertainty(data=clean,layer=1)"
    assert by_layer(clean) == pytest.approx({"1": 0.0225, "4": 0.0225}, abs=1e-7)
    assert NeuronUncertainty(data="clean").per_attack is False


def test_layers_can_be_chosen(ctx):
    values = NeuronSensitivity(layers=["4"]).compute(ctx, SPEC, 1.0)
    assert [v.metric for v in values] == ["neuron-sensitivity(layer=4)"]


def test_zoo_neuron_metrics_invariants(zoo_predictor, mnist_subset):
    data = mnist_subset(30)
    spec = AttackSpec(name="pgd-linf", config={"steps": 3}, eps=(0.0, 0.2))
    zoo = EvaluationContext(zoo_predictor, data, lambda s: PGDLinf(s.config), batch_size=16)
    # eps = 0: PGD cannot move (the random start is projected back), so nothing changes.
    assert all(v.value == 0.0 for v in NeuronSensitivity().compute(zoo, spec, 0.0))
    moved = NeuronSensitivity().compute(zoo, spec, 0.2)
    assert [v.details["layer"] for v in moved] == ["1", "4", "8"]
    assert all(v.value > 0 and v.details["max_neuron"] >= v.value for v in moved)
    uncertainty = NeuronUncertainty().compute(zoo, spec, 0.2)
    assert all(v.value >= 0 for v in uncertainty)


def test_per_layer_rows_are_stored_and_queryable(tmp_path):
    plan = EvaluationPlan.model_validate(
        {
            "dataset": {"name": "mnist-embedded", "limit": 20},
            "attacks": [{"name": "fgsm", "eps": 0.1}],
            "metrics": [
                "neuron-sensitivity",
                {"name": "neuron-uncertainty", "config": {"data": "clean"}},
            ],
        }
    )
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    record = Runner(plan, store, quiet=True).run()
    assert len(record.values) == 6  # 3 layers x 2 metrics
    _, rows = store.query(
        "SELECT metric, attack, value FROM results WHERE metric LIKE 'neuron-sensitivity%' "
        "ORDER BY metric"
    )
    assert [r[0] for r in rows] == [f"neuron-sensitivity(layer={n})" for n in ("1", "4", "8")]
    assert all(r[1] == "fgsm" and r[2] > 0 for r in rows)
    np.testing.assert_allclose(
        [r[2] for r in rows],
        [v.value for v in record.values if v.metric.startswith("neuron-sensitivity")],
    )
