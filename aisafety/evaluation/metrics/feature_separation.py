"""Attack-independent robustness from how well the model's features separate its classes.

RDI (Song et al., "RDI: an adversarial robustness evaluation metric ... based on model
statistical features", Algorithm 1, eqs. 2-7) and ROBY (Jin et al. 2022, as the RDI paper's
supplement A writes it, the baseline RDI improves on). Both group the feature vectors by the
model's *predicted* label (the partition the model learned, not the true one), need only clean
data and cost one forward pass. Classes the model never predicts are left out (K counts the
predicted classes).

Registered metrics: ``rdi``, ``roby``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.features import HEAD_INPUT, extract_features
from aisafety.interfaces import Capability, Direction, MetricValue


@dataclass(frozen=True)
class ClassGeometry:
    """Per predicted class k: the centre E_k (eq. 2) and each sample's distance to it."""

    classes: torch.Tensor  # (K,) the predicted labels present
    centres: torch.Tensor  # (K, d)
    counts: torch.Tensor  # (K,) |N_k|
    member: torch.Tensor  # (n,) index into ``classes`` of each sample
    distance: torch.Tensor  # (n,) ||E(x_i) - E_k||_2 (eq. 1)

    @classmethod
    def of(cls, vectors: torch.Tensor, labels: torch.Tensor) -> ClassGeometry:
        vectors = vectors.double()
        classes, member, counts = labels.unique(return_inverse=True, return_counts=True)
        sums = torch.zeros(len(classes), vectors.shape[1], dtype=vectors.dtype)
        centres = sums.index_add_(0, member, vectors) / counts[:, None]
        distance = (vectors - centres[member]).norm(dim=1)
        return cls(classes, centres, counts, member, distance)

    def class_mean(self, values: torch.Tensor) -> torch.Tensor:
        """(K,) mean of per-sample ``values`` within each class."""
        sums = torch.zeros(len(self.classes), dtype=values.dtype).index_add_(0, self.member, values)
        return sums / self.counts


def rdi(vectors: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """RDI = (InterD - IntraD) / max(InterD, IntraD) (eq. 7), with the parts it is made of.

    IntraD: mean over classes of the mean distance to the class centre (eqs. 3-4); InterD:
    mean distance of the class centres to their mean E_0 (eqs. 5-6).
    """
    geometry = ClassGeometry.of(vectors, labels)
    intra = float(geometry.class_mean(geometry.distance).mean())
    centre_of_centres = geometry.centres.mean(0)
    inter = float((geometry.centres - centre_of_centres).norm(dim=1).mean())
    largest = max(inter, intra)
    value = (inter - intra) / largest if largest > 0 else float("nan")
    return {"rdi": value, "intra_d": intra, "inter_d": inter, "classes": len(geometry.classes)}


def min_max(values: torch.Tensor) -> torch.Tensor:
    """Scale to [0, 1]; all-equal values (nothing to scale) map to 0."""
    low, high = values.min(), values.max()
    if high == low:
        return torch.zeros_like(values)
    return (values - low) / (high - low)


def roby(vectors: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """ROBY as the RDI paper's supplement A: per class pair (k, l),
    ROBY_kl = FSA_k + FSA_l - FSD_kl, then ROBY = mean over pairs of norm(ROBY_kl).

    FSA_k = (1/|N_k|) sum_i norm(dist)_i: the mean of the sample-to-centre distances after
    min-max scaling over all samples; FSD_kl = norm(dist(c_k, c_l)), min-max over the pairs.
    Lower is more robust (the supplement). Needs at least 3 predicted classes to vary.
    """
    geometry = ClassGeometry.of(vectors, labels)
    k = len(geometry.classes)
    if k < 2:
        return {"roby": float("nan"), "classes": k}
    fsa = geometry.class_mean(min_max(geometry.distance))
    first, second = torch.triu_indices(k, k, offset=1)
    centres = geometry.centres
    fsd = min_max((centres[first] - centres[second]).norm(dim=1))
    pairs = fsa[first] + fsa[second] - fsd
    return {"roby": float(min_max(pairs).mean()), "classes": k}


class FeatureConfig(PluginConfig):
    layer: str = Field(
        default=HEAD_INPUT,
        description="'head-input' (the input of the last nn.Linear), a layer name from the "
        "model's layer_names(), or 'logits'",
    )


class _FeatureSeparation(CleanMetric):
    requires = Capability.ACTIVATIONS
    category = "attack-independent"
    Config = FeatureConfig
    key: str

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        features = extract_features(ctx.predictor, ctx.x, self.config.layer, ctx.batch_size)
        parts = self.formula(features.vectors, features.predicted)
        details = {k: v for k, v in parts.items() if k != self.key}
        details["layer"] = self.config.layer
        details["feature_dim"] = int(features.vectors.shape[1])
        return [self.value(parts[self.key], len(features.predicted), **details)]

    @staticmethod
    def formula(vectors: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        raise NotImplementedError


class RobustnessDifferenceIndex(_FeatureSeparation):
    name = "rdi"
    description = "Robustness Difference Index: (InterD - IntraD) / max(InterD, IntraD) of features"
    direction = Direction.HIGHER
    unit = "index in [-1, 1]"
    key = "rdi"
    formula = staticmethod(rdi)


class Roby(_FeatureSeparation):
    name = "roby"
    description = "ROBY (Jin et al. 2022, RDI supplement A): min-max-normalised feature separation"
    direction = Direction.LOWER
    unit = "index in [0, 1]"
    key = "roby"
    formula = staticmethod(roby)
