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


def check_reference_classes(predictor: Predictor, reference: Predictor) -> None:
    """Refuse a reference of another class count than the evaluated model, before any work.

    Every metric that reads the reference compares the two models class by class: CAV, CRR
    and CSR read the labels as both models' class indices, CCV the true class's probability
    under each, COS a divergence between two distributions over the same classes; mFR reads
    only each model's own flips, but its baseline is the same task's model. A 100-class
    reference against a 10-class model stored CAV and CRR without a word (the reference's
    predictions of classes the data lacks counted as its errors). A refusal, not a warning:
    a defended model with an extra (reject) class is compared with its reference wrapped to
    the same outputs (docs/metrics.md).
    """
    if reference.num_classes == predictor.num_classes:
        return
    raise ConfigError(
        f"reference model {reference.name!r} has {reference.num_classes} classes and the "
        f"evaluated model {predictor.name!r} has {predictor.num_classes}: the metrics that "
        "read the reference (cav, crr, csr, ccv, cos, mfr) compare the two models class by "
        "class, so both must answer the same classes in the same order; give a "
        "reference_model of the evaluated model's classes, e.g. its undefended version "
        "(docs/metrics.md)"
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
