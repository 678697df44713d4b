"""The corruptions as attacks: one ``Attack`` subclass per corruption, registered by name.

A corruption is a fixed, model-independent transformation: it needs only labels from the
predictor (to score the result), has no budget (``eps`` is accepted and ignored, since
severity is the knob) and no norm, so the base class only clamps to [0, 1]. ``steps`` is 1
per sample.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.corruption.base import CORRUPTIONS, corrupt
from aisafety.corruption.params import TABLE_NAMES
from aisafety.interfaces import AttackFamily, Capability
from aisafety.prediction.base import Predictor

# float32 copies of an image one corruption holds at once, with a margin: measured at
# 224x224, severity 5, peak resident growth per image of a batch of 8, elastic_transform
# held 14.8, snow 8.5, the others 2.8-7.9 (docs/memory.md)
IMAGE_COPIES = 24


class CorruptionConfig(AttackConfig):
    severity: int = Field(default=3, ge=1, le=5)
    table: Literal[TABLE_NAMES] = Field(
        default="auto", description="severity table; auto: by image size (docs/corruptions.md)"
    )


class Corruption(Attack):
    """Base of the 19 corruption attacks; a subclass only sets ``name``."""

    family = AttackFamily.CORRUPTION
    norm = None
    requires = Capability.LABELS
    Config: ClassVar[type[AttackConfig]] = CorruptionConfig

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name not in CORRUPTIONS:
            raise TypeError(f"{cls.__name__}: no corruption named {cls.name!r}")
        label = cls.name.replace("_", " ")
        cls.description = (
            f"{label} corruption, severity 1-5 (Hendrycks & Dietterich 2019; CIFAR-10-C,"
            " Tiny-ImageNet-C or ImageNet-C table);"
            " eps is ignored"
        )

    def image_memory(self, predictor: Predictor) -> int:
        """The corruption's own copies of one image (its model passes are split apart)."""
        return IMAGE_COPIES * 4 * math.prod(predictor.input_shape)

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = corrupt(x, self.name, self.config.severity, self.config.seed, self.config.table)
        return out, torch.ones(len(x), dtype=torch.long, device=x.device)


class GaussianNoise(Corruption):
    name = "gaussian_noise"


class ShotNoise(Corruption):
    name = "shot_noise"


class ImpulseNoise(Corruption):
    name = "impulse_noise"


class SpeckleNoise(Corruption):
    name = "speckle_noise"


class DefocusBlur(Corruption):
    name = "defocus_blur"


class GlassBlur(Corruption):
    name = "glass_blur"


class MotionBlur(Corruption):
    name = "motion_blur"


class ZoomBlur(Corruption):
    name = "zoom_blur"


class GaussianBlur(Corruption):
    name = "gaussian_blur"


class Snow(Corruption):
    name = "snow"


class Frost(Corruption):
    name = "frost"


class Fog(Corruption):
    name = "fog"


class Spatter(Corruption):
    name = "spatter"


class Brightness(Corruption):
    name = "brightness"


class Contrast(Corruption):
    name = "contrast"


class Saturate(Corruption):
    name = "saturate"


class ElasticTransform(Corruption):
    name = "elastic_transform"


class Pixelate(Corruption):
    name = "pixelate"


class JpegCompression(Corruption):
    name = "jpeg_compression"


CORRUPTION_ATTACKS: list[type[Corruption]] = [
    GaussianNoise, ShotNoise, ImpulseNoise, SpeckleNoise,
    DefocusBlur, GlassBlur, MotionBlur, ZoomBlur, GaussianBlur,
    Snow, Frost, Fog, Spatter,
    Brightness, Contrast, Saturate, ElasticTransform, Pixelate, JpegCompression,
]  # fmt: skip
