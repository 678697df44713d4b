"""The reference model: the undefended baseline a defended model is compared with.

Defense-cost metrics (CAV, CRR/CSR, CCV, COS) compare clean predictions of the evaluated
model with those of the reference; the reference runs over the data once and every metric
reads the same outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from aisafety.errors import ConfigError
from aisafety.evaluation.inference import batched_logits
from aisafety.prediction.base import Predictor


def missing_reference(user: str) -> ConfigError:
    """The error for a metric that needs a reference model when the plan gives none."""
    return ConfigError(
        f"{user} compares the evaluated model with a reference (undefended) model, but the "
        "plan has no 'reference_model'; add e.g. 'reference_model: {name: mnist-cnn}' "
        "(see docs/configuration.md)"
    )


@dataclass
class ReferenceOutputs:
    """The reference predictor and its clean logits on the evaluated data."""

    predictor: Predictor
    logits: torch.Tensor

    @classmethod
    def compute(cls, predictor: Predictor, x: torch.Tensor, batch_size: int) -> ReferenceOutputs:
        return cls(predictor, batched_logits(predictor, x, batch_size))

    @property
    def name(self) -> str:
        return self.predictor.name

    @cached_property
    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits.double(), dim=1)

    @cached_property
    def pred(self) -> torch.Tensor:
        return self.logits.argmax(1)
