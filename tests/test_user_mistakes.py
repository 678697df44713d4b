"""A user's first hour with their own CIFAR-10 model: each usual mistake is one message that
names the thing, the value and the fix, never a traceback (session 11's walk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import aisafety
from aisafety.errors import ConfigError
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model

PLAN = {"dataset": {"limit": 2}, "metrics": ["ca"]}


class Extra(nn.Module):
    """Logits plus something else, as training code with an auxiliary loss returns them."""

    def __init__(self, as_dict: bool):
        super().__init__()
        self.as_dict = as_dict
        self.fc = nn.Linear(3 * 4 * 4, 10)

    def forward(self, x):
        logits = self.fc(x.flatten(1))
        return {"logits": logits, "aux": x.mean()} if self.as_dict else (logits, x.mean())


def extra(as_dict: bool = False) -> Extra:
    return Extra(as_dict)


def _images(n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    return np.random.default_rng(0).random((n, 3, 4, 4), dtype=np.float32), np.zeros(n, int)


@pytest.mark.parametrize(
    "as_dict, returns, fix",
    [
        (False, "a tuple (0: tensor (1, 10), 1: tensor ())", "returns net(x)[0]"),
        (True, "a dict ('logits': tensor (1, 10), 'aux': tensor ())", "returns net(x)['logits']"),
    ],
)
def test_a_module_returning_more_than_logits_is_named_with_the_element_to_return(
    tmp_path, as_dict, returns, fix
):
    with pytest.raises(ConfigError) as caught:  # was AttributeError: 'tuple' has no 'dim'
        aisafety.evaluate(PLAN, f"sqlite:///{tmp_path}/a.db", model=Extra(as_dict), data=_images())
    assert returns in str(caught.value) and fix in str(caught.value)
    spec = ModelSpec(
        name="m", source="python", factory=f"{__name__}:extra", kwargs={"as_dict": as_dict},
        input_shape=(3, 4, 4),
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_model(spec, torch.device("cpu"))
    assert returns in str(caught.value) and fix in str(caught.value)
