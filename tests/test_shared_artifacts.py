"""Artifacts are built once and shared: one PGD run feeds every per-attack metric.

ACAC, ACTC, NTE, ALD, ASS, PSD, neuron sensitivity, the coverage metrics and neuron
uncertainty over one PGD spec and budget must cost one PGD run, one pass for the neuron
outputs of the adversarial set and one pass over the profile data for the bounds.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from aisafety.attack.pgd import PGDLinf
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.adversarial_confidence import (
    AverageConfidenceAdversarialClass,
    AverageConfidenceTrueClass,
    NoiseToleranceEstimation,
)
from aisafety.evaluation.metrics.imperceptibility import (
    AverageLpDistortion,
    AverageStructuralSimilarity,
)
from aisafety.evaluation.metrics.neuron import NeuronSensitivity, NeuronUncertainty
from aisafety.evaluation.metrics.neuron_coverage import (
    KMultisectionNeuronCoverage,
    NeuronBoundaryCoverage,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
)
from aisafety.evaluation.metrics.perturbation_sensitivity import PerturbationSensitivityDistance
from aisafety.interfaces import AttackSpec, EvaluationPlan
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

PER_ATTACK = ["acac", "actc", "nte", "ald", "ass", "psd", "neuron-sensitivity"]
NEURON = ["kmncov", "nbcov", "snacov", "tkncov", "neuron-uncertainty"]


def all_metrics():
    return [
        AverageConfidenceAdversarialClass(),
        AverageConfidenceTrueClass(),
        NoiseToleranceEstimation(),
        AverageLpDistortion(),
        AverageLpDistortion(p="inf"),
        AverageStructuralSimilarity(),
        PerturbationSensitivityDistance(),
        NeuronSensitivity(),
        KMultisectionNeuronCoverage(),
        NeuronBoundaryCoverage(),
        StrongNeuronActivationCoverage(),
        TopKNeuronCoverage(),
        NeuronUncertainty(),
    ]


def test_context_runs_pgd_once_for_every_metric(zoo_predictor, mnist_subset):
    data, profile = mnist_subset(40), mnist_subset(100, seed=3)
    spec = AttackSpec(name="pgd-linf", config={"steps": 3}, eps=(0.1,))
    built: list[PGDLinf] = []

    def make_attack(s: AttackSpec) -> PGDLinf:
        built.append(PGDLinf(s.config))
        return built[-1]

    profile_loads = []

    def load_profile():
        profile_loads.append(1)
        return profile

    ctx = EvaluationContext(
        zoo_predictor, data, make_attack, batch_size=16, load_profile=load_profile
    )
    first = [m.compute(ctx, spec, 0.1)[0] for m in all_metrics()]
    second = [m.compute(ctx, spec, 0.1)[0] for m in all_metrics()]
    assert ctx.attack_runs == Counter({(spec.key(), 0.1): 1})
    assert len(built) == 1
    assert ctx.neurons.passes == {"outputs": 1, "deviation": 1, "bounds": 1}
    assert len(profile_loads) == 1

    def numbers(values):
        flat = [v for value in values for v in (value if isinstance(value, list) else [value])]
        return [v.value for v in flat]

    np.testing.assert_equal(numbers(first), numbers(second))


def test_runner_calls_pgd_once_per_budget(tmp_path, monkeypatch):
    calls: list[float] = []
    original = PGDLinf.__call__

    def counting(self, predictor, x, y, eps, **kwargs):
        calls.append(eps)
        return original(self, predictor, x, y, eps, **kwargs)

    monkeypatch.setattr(PGDLinf, "__call__", counting)
    plan = EvaluationPlan.model_validate(
        {
            "dataset": {"name": "mnist-embedded", "limit": 20},
            "profile_dataset": {"name": "mnist-embedded", "split": "train", "limit": 100},
            "attacks": [{"name": "pgd-linf", "config": {"steps": 2}, "eps": [0.1, 0.2]}],
            "metrics": ["aaw", *PER_ATTACK, *NEURON],
        }
    )
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    record = Runner(plan, store, quiet=True).run()
    assert calls == [0.1, 0.2]
    labels = {v.metric for v in record.values if v.eps == 0.1}
    assert {"psd", "kmncov", "tkncov", "neuron-sensitivity(layer=8)"} <= labels
    assert "neuron-uncertainty(layer=1)" in labels


def test_profile_data_defaults_to_the_whole_train_split(tmp_path):
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    plan = EvaluationPlan.model_validate({"dataset": {"name": "mnist-embedded", "limit": 20}})
    profile = Runner(plan, store, quiet=True)._profile_spec()
    assert (profile.name, profile.split, profile.limit) == ("mnist-embedded", "train", None)
    chosen = plan.model_copy(update={"profile_dataset": plan.dataset})
    assert Runner(chosen, store, quiet=True)._profile_spec() == plan.dataset
