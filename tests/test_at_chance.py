"""A model at chance accuracy on the plan's images is named in a warning (wrong mean/std,
scale or layout ran silently: every number was that of a model blind to its inputs)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from aisafety.config import plan_from_dict
from aisafety.errors import AISafetyWarning, AtChanceWarning
from aisafety.evaluation.chance import (
    MIN_IMAGES,
    above_chance_p,
    chance_level,
    chance_warning,
)
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k), X ~ Binomial(n, p), summed term by term (the reference)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.parametrize("k, n, p", [(0, 30, 0.1), (3, 30, 0.1), (7, 30, 0.1), (12, 40, 0.25)])
def test_the_p_value_is_the_binomial_upper_tail(k, n, p):
    assert above_chance_p(k, n, p) == pytest.approx(_binomial_tail(k, n, p), rel=1e-9)


def test_chance_is_the_larger_of_one_over_k_and_the_commonest_label():
    assert chance_level(torch.arange(20) % 10, 10) == 0.1
    assert chance_level(torch.tensor([0, 1, 2, 3]), 10) == 0.25  # 4 of 10 labels present
    assert chance_level(torch.tensor([3, 3, 3, 1]), 10) == 0.75


def test_the_warning_needs_enough_images_and_more_than_one_label():
    assert chance_warning("m", 3, MIN_IMAGES, 0.1) is not None  # 0.1 of 30: at chance
    assert chance_warning("m", 1, MIN_IMAGES - 1, 0.1) is None  # too few to say
    assert chance_warning("m", 30, 30, 1.0) is None  # one label: nothing is above it
    assert chance_warning("m", 9, 30, 0.1) is None  # p = 0.0020: above chance
    assert chance_warning("m", 7, 30, 0.1) is not None  # p = 0.026: not at 0.01


class _Constant(nn.Module):
    """Class 0 for every image: the accuracy is the share of label 0 (a blind model)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(784, 10)

    def forward(self, x):
        return self.linear(x.flatten(1)) * 0 + torch.arange(10.0, 0, -1)


def _warnings(predictor, tmp_path, limit: int) -> list[str]:
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], "dataset": {"limit": limit}}, "p")
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    model = None if predictor is None else (predictor, predictor.name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Runner(plan, store, quiet=True, model=model).run()
    return [str(w.message) for w in caught if "not above chance" in str(w.message)]


def test_a_blind_model_is_named_with_its_accuracy_chance_and_the_fields_to_check(tmp_path):
    (message,) = _warnings(TorchPredictor(_Constant(), (1, 28, 28), 10, name="blind"), tmp_path, 40)
    assert message.startswith("model 'blind' has clean accuracy 0.100 (4/40) on the plan's")
    p = _binomial_tail(4, 40, 0.1)  # 0.58: four of forty is what chance gives
    assert f"not above chance (0.100; one-sided binomial p = {p:.2g})" in message
    for field in ("model.mean/std", "model.scale", "model.layout", "label order"):
        assert field in message


def test_a_trained_model_and_a_small_plan_get_no_warning(tmp_path):
    assert _warnings(None, tmp_path, 40) == []  # the zoo's mnist-cnn, 99% clean accuracy
    blind = TorchPredictor(_Constant(), (1, 28, 28), 10, name="blind")
    assert _warnings(blind, tmp_path, MIN_IMAGES - 1) == []


def blind() -> nn.Module:
    return _Constant()


def test_a_ray_worker_hands_the_warning_to_the_driver(tmp_path):
    """On Ray the clean pass runs on a worker, whose warnings do not reach the driver: the
    worker's prepare returns the warning, the driver warns and stores it (executor.py;
    tests/test_run_warnings.py runs it on a cluster)."""
    from aisafety.distributed.tasks import prepare

    model = {"name": "blind", "source": "python", "factory": f"{__name__}:blind"}
    fields = {"model": {**model, "input_shape": [1, 28, 28]}, "dataset": {"limit": 40}}
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], **fields}, "p")
    info, _ = prepare(plan, f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    (warning,) = info["warnings"]
    # its own class since session 21 (the report counts warnings by kind), an AISafetyWarning
    assert warning.category is AtChanceWarning and warning.unit_key is None
    assert issubclass(AtChanceWarning, AISafetyWarning)
    assert warning.message.startswith("model 'blind' has clean accuracy 0.100 (4/40)")


class _NoisyBlind(nn.Module):
    """Class 0 for every image, plus noise far below the logit gaps: at chance accuracy, and
    two forward passes of one batch differ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.arange(10.0, 0, -1).expand(len(x), 10) + 0.01 * torch.randn(len(x), 10)


def noisy_blind() -> nn.Module:
    return _NoisyBlind()


def test_a_ray_worker_hands_the_determinism_warning_to_the_driver(tmp_path):
    """The prepare task makes the local run's determinism check too (session 19) and returns
    its message beside the chance one; the whole path on a cluster is
    test_scale_out.test_the_clean_pass_checks_of_a_worker_reach_the_driver."""
    from aisafety.distributed.tasks import prepare

    model = {"name": "noisy", "source": "python", "factory": f"{__name__}:noisy_blind"}
    fields = {"model": {**model, "input_shape": [1, 28, 28]}, "dataset": {"limit": 40}}
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], **fields}, "p")
    info, _ = prepare(plan, f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    determinism, chance = (w.message for w in info["warnings"])
    assert determinism.startswith("model 'noisy' is not deterministic: two forward passes")
    assert chance.startswith("model 'noisy' has clean accuracy 0.100 (4/40)")


class _Pixels255(nn.Module):
    """Trained on 0..255 pixels: class 1 where the mean pixel exceeds 10, else class 0. Fed
    [0, 1] images it always answers 0; fed 255 x, it reads every image right."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        score = x.flatten(1).mean(1, keepdim=True) - 10
        return torch.cat([-score, score], 1)


def test_a_module_handed_to_evaluate_is_told_evaluates_arguments_and_the_fix_works(tmp_path):
    """The warning named the plan's model.scale and model.layout, which aisafety.evaluate()
    does not take (it has no scale=); for a module it names mean=/std= and the values that
    feed a 0..255 network, checked here to make the model see its images."""
    import aisafety

    labels = torch.arange(40) % 2
    images = (0.02 + 0.5 * labels).view(40, 1, 1, 1).expand(40, 1, 8, 8).contiguous()
    db, plan = f"sqlite:///{tmp_path / 'r.db'}", {"device": "cpu", "metrics": ["ca"]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        blind = aisafety.evaluate(plan, db, model=_Pixels255(), data=(images, labels))
    (message,) = [str(w.message) for w in caught if "not above chance" in str(w.message)]
    assert "model.scale" not in message and "model.layout" not in message
    assert "aisafety.evaluate's mean= and std=" in message
    assert "mean=(0, 0, 0), std=(1/255, 1/255, 1/255)" in message
    fixed = aisafety.evaluate(plan, db, model=_Pixels255(), data=(images, labels),
                              mean=(0.0,), std=(1 / 255,))  # fmt: skip
    assert [v.value for v in blind.values] == [0.5] and [v.value for v in fixed.values] == [1.0]
