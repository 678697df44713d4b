"""A model that returns probabilities (a final softmax) is named in a warning: every
confidence metric softmaxes what the model returns, so it stored softmax(p) without a word
(mnist-cnn with a softmax appended: acac under PGD 0.20 against the network's 0.82)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from aisafety.config import plan_from_dict
from aisafety.evaluation.probabilities import are_probabilities
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


def test_softmax_rows_are_probabilities_and_logits_are_not():
    logits = torch.randn(8, 1000, generator=torch.Generator().manual_seed(0)) * 5
    assert are_probabilities(torch.softmax(logits, 1))
    assert are_probabilities(torch.softmax(logits[:, :10], 1).double())
    assert not are_probabilities(logits)
    assert not are_probabilities(torch.log_softmax(logits, 1))  # logits up to a shift
    assert not are_probabilities(torch.relu(logits))  # the Keras CNN's ReLU'd logits
    assert not are_probabilities(torch.softmax(logits, 1) * 0.9)  # rows sum to 0.9
    assert not are_probabilities(torch.ones(4, 1))  # one class: a softmax is always 1
    assert not are_probabilities(torch.empty(0, 10))


class _Net(nn.Module):
    """A linear MNIST classifier returning logits, probabilities or log-probabilities."""

    def __init__(self, output: str = "logits") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(784, 10)
        self.output = output

    def forward(self, x):
        z = self.linear(x.flatten(1))
        if self.output == "softmax":
            return torch.softmax(z, 1)
        return torch.log_softmax(z, 1) if self.output == "log_softmax" else z


def _warnings(output: str, tmp_path) -> list[str]:
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], "dataset": {"limit": 4}}, "p")
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    predictor = TorchPredictor(_Net(output), (1, 28, 28), 10, name=output)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Runner(plan, store, quiet=True, model=(predictor, output)).run()
    return [str(w.message) for w in caught if "probabilities" in str(w.message)]


def test_a_softmax_model_is_named_with_the_fix(tmp_path):
    (message,) = _warnings("softmax", tmp_path)
    assert message.startswith("model 'softmax' returns probabilities, not logits: each of its 4")
    assert "acac" in message and "remove the model's final softmax" in message


@pytest.mark.parametrize("output", ["logits", "log_softmax"])
def test_logits_and_log_probabilities_get_no_warning(output, tmp_path):
    assert _warnings(output, tmp_path) == []


def softmax_net() -> nn.Module:
    return _Net("softmax")


def test_a_ray_worker_hands_the_probabilities_warning_to_the_driver(tmp_path):
    """On Ray the clean pass runs in the prepare task, whose warnings the driver receives in
    its answer (test_at_chance's tests of the same path)."""
    from aisafety.distributed.tasks import prepare

    model = {"name": "soft", "source": "python", "factory": f"{__name__}:softmax_net"}
    fields = {"model": {**model, "input_shape": [1, 28, 28]}, "dataset": {"limit": 4}}
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], **fields}, "p")
    info, _ = prepare(plan, f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    (message,) = (w.message for w in info["warnings"])
    assert message.startswith("model 'soft' returns probabilities, not logits: each of its 4")
