"""Perturbation Sensitivity Distance (PSD): perturbation size weighted by how visible it is.

Contrast masking (Legge & Foley 1980): a change is harder to see in a busy region than in a
flat one. Luo et al. (2018) weight each pixel's perturbation by Sen(R(x_j)) = 1 / std(R(x_j)),
R(x_j) the square region around pixel j of the clean image; AISafety eq. 6 sums these over
pixels and averages over examples.

Registered metrics: ``psd``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import AttackMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.successful import successful_mask
from aisafety.interfaces import AttackSpec, Direction, MetricValue


def local_std(x: torch.Tensor, region: int) -> torch.Tensor:
    """Population std of each pixel's ``region`` x ``region`` neighbourhood, per channel.

    Borders are reflected (numpy 'reflect', as the AISafety and DEEPSEC code pad), so every
    pixel has a full region. Computed in float64 so flat regions give std 0, not rounding noise.
    """
    pad = region // 2
    padded = F.pad(x.double(), (pad, pad, pad, pad), mode="reflect")
    mean = F.avg_pool2d(padded, region, stride=1)
    mean_sq = F.avg_pool2d(padded * padded, region, stride=1)
    return (mean_sq - mean * mean).clamp_min(0).sqrt()


def perturbation_sensitivity_distance(
    x: torch.Tensor,
    x_adv: torch.Tensor,
    region: int = 3,
    min_std: float = 1 / 255,
    sensitivity: Literal["inverse-std", "std"] = "inverse-std",
) -> torch.Tensor:
    """Per example: sum over pixels and channels of |x_adv - x| * Sen(R(x)).

    ``inverse-std`` is eq. 6 and Luo et al.: Sen = 1 / max(std, min_std) (the floor keeps
    perfectly flat regions, e.g. MNIST's background, finite). ``std`` multiplies by the std
    instead, as the AISafety platform's own code does (it reproduces that paper's tables).
    """
    std = local_std(x, region)
    weight = 1.0 / std.clamp_min(min_std) if sensitivity == "inverse-std" else std
    return ((x_adv.double() - x.double()).abs() * weight).flatten(1).sum(1)


class PSDConfig(PluginConfig):
    region: int = Field(default=3, ge=3)  # side of the square neighbourhood (odd)
    min_std: float = Field(default=1 / 255, gt=0)  # floor of the local std: one grey level
    sensitivity: Literal["inverse-std", "std"] = "inverse-std"

    @field_validator("region")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"region must be odd so it is centred on its pixel, got {value}")
        return value


class PerturbationSensitivityDistance(AttackMetric):
    """AISafety eq. 6 (Luo et al. 2018), averaged over successful examples like ALD and ASS."""

    name = "psd"
    description = (
        "Perturbation sensitivity distance: |perturbation| weighted by 1/local std of the "
        "clean image, summed over pixels, averaged over successful adversarial examples"
    )
    direction = Direction.HIGHER  # the attacker needed a more visible change: more robust
    unit = "weighted l1"
    category = "data"
    Config = PSDConfig

    def compute(self, ctx: EvaluationContext, attack: AttackSpec, eps: float) -> list[MetricValue]:
        result = ctx.adversarial(attack, eps)
        mask = successful_mask(result)
        if not mask.any():
            return [self.value(float("nan"), 0, attack, eps)]
        x, x_adv = result.x[mask], result.x_adv[mask]
        step = ctx.batch_size  # float64 copies of a whole large set would not fit in memory
        distances = torch.cat(
            [
                perturbation_sensitivity_distance(
                    x[i : i + step], x_adv[i : i + step], **self.config.model_dump()
                )
                for i in range(0, len(x), step)
            ]
        )
        return [self.value(distances.mean(), len(x), attack, eps)]
