"""The entry-point module: aisafety registers it and calls these hooks.

Each hook returns a list of classes; a hook this plugin does not need (datasets here) is
simply not defined. Hook names must match ``aisafety.hookspecs`` exactly: a misspelt hook
makes the whole plugin fail to load (``aisafety plugins`` shows why).
"""

from __future__ import annotations

from aisafety.hookspecs import hookimpl
from aisafety_example.gaussian_blur import GaussianBlur
from aisafety_example.mean_margin import MeanMargin
from aisafety_example.uniform_noise import UniformNoiseLinf


@hookimpl
def aisafety_attacks() -> list[type]:
    return [UniformNoiseLinf]


@hookimpl
def aisafety_defenses() -> list[type]:
    return [GaussianBlur]


@hookimpl
def aisafety_metrics() -> list[type]:
    return [MeanMargin]
