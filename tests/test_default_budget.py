"""An attack or certified-accuracy without eps runs at 0.1, MNIST's scale: off MNIST the run
warns (shown and stored), naming the default, its 0..255 value and the dataset. Nothing
changes for a plan that gives eps."""

from __future__ import annotations

import warnings

import pytest

from aisafety.config import plan_from_dict
from aisafety.errors import AISafetyWarning
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

CERTIFIED = {"name": "certified-accuracy", "config": {"verifier": "ibp"}}


def budget_warnings(tmp_path, plan: dict) -> list[str]:
    """The default-budget warnings a Runner of ``plan`` keeps for its run (built, not run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = Runner(plan_from_dict(plan, "test"), ResultStore(f"sqlite:///{tmp_path}/d.db"))
    return [w.message for w in runner.warning_log.entries if "gives no eps" in w.message]


def test_cifar_without_eps_warns_for_each_attack_and_the_certified_metric(tmp_path):
    plan = {"dataset": {"name": "cifar10-embedded"}, "metrics": ["ca", CERTIFIED],
            "attacks": [{"name": "fgsm"}, {"name": "pgd-linf", "eps": [0.03]}]}  # fmt: skip
    fgsm, certified = budget_warnings(tmp_path, plan)
    assert fgsm.startswith("attack 'fgsm' gives no eps and runs at the default 0.1 (25.5/255")
    assert certified.startswith("metric 'certified-accuracy' gives no eps and runs at the default")
    for message in (fgsm, certified):
        assert "dataset 'cifar10-embedded'" in message and "0.03137254901960784" in message


@pytest.mark.parametrize(
    "plan",
    [{"dataset": {"name": "mnist-embedded"}, "attacks": [{"name": "fgsm"}], "metrics": [CERTIFIED]},
     {"dataset": {"name": "cifar10-embedded"}, "attacks": [{"name": "fgsm", "eps": 0.1}],
      "metrics": [{"name": "certified-accuracy", "config": {"eps": 0.1, "verifier": "ibp"}}]}],
    ids=["mnist", "eps-given"],
)  # fmt: skip
def test_mnist_or_a_given_eps_is_not_warned(tmp_path, plan):
    assert budget_warnings(tmp_path, plan) == []


def test_the_warning_is_shown_once_as_an_aisafety_warning(tmp_path):
    plan = plan_from_dict({"dataset": {"name": "svhn"}, "attacks": [{"name": "fgsm"}]}, "test")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        Runner(plan, ResultStore(f"sqlite:///{tmp_path}/d.db"))
    (warned,) = [w for w in shown if "gives no eps" in str(w.message)]
    assert warned.category is AISafetyWarning and "dataset 'svhn'" in str(warned.message)
