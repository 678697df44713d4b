"""A predictor that runs another predictor's network differently (another dtype, another
memory layout) and is otherwise that predictor: same name, capabilities, shape, device and
watchdog, and any attribute a plugin reads (``network``, ...) is the inner one's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from aisafety.prediction.base import Predictor


class PredictorView(Predictor):
    """The identity of ``inner``; subclasses say how ``_logits`` (and ``features``) run."""

    def __init__(self, inner: Predictor):
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.input_shape = inner.input_shape
        self.num_classes = inner.num_classes
        self.device = inner.device
        self.forward_timeout = inner.forward_timeout  # the model's watchdog, through the view

    def layer_names(self) -> list[str]:
        return self.inner.layer_names()

    def features(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.inner.features(x, layers)

    def __getattr__(self, name: str) -> Any:
        """Anything else a plugin reads from its predictor (``network``, ...) is the inner's."""
        if name == "inner":  # not set yet (during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
