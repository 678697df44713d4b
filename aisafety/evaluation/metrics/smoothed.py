"""Certified robustness of the randomized-smoothing classifier (CERTIFY, Cohen et al. 2019).

The three metrics share one CERTIFY run per setting (cached on the evaluation context):

- ``smoothed-certified-accuracy``: at each radius r of ``radii``, the fraction of images the
  smoothed classifier certifies with the right label at radius >= r (Cohen et al.'s
  approximate certified accuracy, the curve the SoK tables report); one value per radius.
- ``smoothed-average-certified-radius``: mean over images of the radius, counting 0 for
  wrong or abstained answers (the ACR of Zhai et al. 2020).
- ``smoothed-abstention-rate``: fraction of images where CERTIFY abstains.

The smoothed classifier is the plan's ``randomized-smoothing`` defense when there is one
(its noise, scale and seed), else the evaluated model smoothed with the metric's ``noise``
and ``sigma``. Only the base model's labels are needed. Each value carries the per-image
radius, p_A lower bound, answer and time; the store writes them as rows of
``smoothing_certificates``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from pydantic import Field

from aisafety.config_base import PluginConfig
from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.defense.smoothing.certify import Bound, Certificates, certify
from aisafety.defense.smoothing.noise import Noise
from aisafety.errors import ConfigError
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.interfaces import Capability, Direction, MetricValue, SmoothingCertificates


class SmoothedCertificationConfig(PluginConfig):
    noise: Noise | None = Field(
        default=None,
        description="default: the plan's randomized-smoothing defense's, else gaussian",
    )
    sigma: float | None = Field(
        default=None, gt=0, description="noise scale; default: the defense's, else 0.25"
    )
    n0: int = Field(default=100, ge=1, description="selection draws per image")
    n: int = Field(default=10_000, ge=1, description="estimation draws per image (Cohen: 100,000)")
    alpha: float = Field(default=0.001, gt=0, lt=1, description="failure probability")
    norm: str | None = Field(default=None, description="l2 / l1 / linf; default: the noise's own")
    bound: Bound = Field(
        default=Bound.NEYMAN_PEARSON, description="or differential-privacy, f-divergence, renyi"
    )
    samples: int | None = Field(default=None, ge=1, description="certify a seeded subset only")
    batch_size: int = Field(default=1000, ge=1, description="noisy images per forward pass")


class SmoothedCertifiedAccuracyConfig(SmoothedCertificationConfig):
    radii: list[float] = Field(default=[0.0, 0.25, 0.5, 0.75, 1.0], min_length=1)


def smoothed_classifier(ctx: EvaluationContext, c: SmoothedCertificationConfig):
    """The smoothed classifier to certify: the plan's smoothing defense, or a new one."""
    predictor = ctx.predictor
    if isinstance(predictor, RandomizedSmoothing):
        own = predictor.config
        for field, value in (("noise", c.noise), ("sigma", c.sigma)):
            if value is not None and value != getattr(own, field):
                raise ConfigError(
                    f"metric setting {field}={value} disagrees with the plan's "
                    f"randomized-smoothing defense ({field}={getattr(own, field)}); drop it "
                    "from the metric (the defense's is used) or from the defense"
                )
        return RandomizedSmoothing(
            predictor.inner, {**own.model_dump(), "batch_size": c.batch_size}
        )
    settings = {
        "noise": (c.noise or Noise.GAUSSIAN).value,
        "sigma": c.sigma or 0.25,
        "seed": ctx.seed,
        "batch_size": c.batch_size,
    }
    return RandomizedSmoothing(predictor, settings)


def certificates(ctx: EvaluationContext, c: SmoothedCertificationConfig) -> tuple[str, Any]:
    """(key, (indices, Certificates)) of one CERTIFY setting on the context's data, cached."""
    setting = c.model_dump(mode="json", exclude={"radii"})
    key = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:16]

    def run() -> tuple[np.ndarray, Certificates]:
        smoothed = smoothed_classifier(ctx, c)
        index = ctx.subset(c.samples)
        x = ctx.x[index].to(smoothed.device)
        return index.numpy(), certify(smoothed, x, c.n0, c.n, c.alpha, c.norm, c.bound)

    return key, ctx.cached(("smoothing-certificates", key), run)


class SmoothedMetric(CleanMetric):
    direction = Direction.HIGHER
    category = "certified"
    requires = Capability.LABELS
    Config = SmoothedCertificationConfig

    def summary(self, ctx: EvaluationContext) -> tuple[np.ndarray, Certificates, dict]:
        """The labels, the certificates, and what every value carries: the setting and norm
        (stored as JSON details) and each image's certificate (stored as rows)."""
        key, (index, cert) = certificates(ctx, self.config)
        y = ctx.y[index].numpy()
        rows = SmoothingCertificates(
            setting=key,
            norm=cert.norm,
            sample_index=index.tolist(),
            label=y.tolist(),
            prediction=cert.prediction.tolist(),
            p_a_lower=cert.p_a_lower.tolist(),
            radius=cert.radius.tolist(),
            seconds=cert.seconds.tolist(),
        )
        details = {"certificates": key, "norm": cert.norm, "smoothing_certificates": rows}
        return y, cert, details


class SmoothedCertifiedAccuracy(SmoothedMetric):
    name = "smoothed-certified-accuracy"
    description = "Fraction certified correct by randomized smoothing at each radius (CERTIFY)"
    unit = "fraction"
    Config = SmoothedCertifiedAccuracyConfig

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        y, cert, details = self.summary(ctx)
        return [
            self.value(cert.certified_correct(y, r).mean(), len(y), eps=r, **details)
            for r in self.config.radii
        ]


class SmoothedAverageCertifiedRadius(SmoothedMetric):
    name = "smoothed-average-certified-radius"
    description = "Mean certified radius of the smoothed classifier, 0 when wrong or abstaining"
    unit = "radius"

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        y, cert, details = self.summary(ctx)
        return [
            self.value(np.where(cert.prediction == y, cert.radius, 0.0).mean(), len(y), **details)
        ]


class SmoothedAbstentionRate(SmoothedMetric):
    name = "smoothed-abstention-rate"
    description = "Fraction of images on which CERTIFY abstains (p_A lower bound below 1/2)"
    direction = Direction.LOWER
    unit = "fraction"

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        y, cert, details = self.summary(ctx)
        return [self.value(cert.abstained.mean(), len(y), **details)]
