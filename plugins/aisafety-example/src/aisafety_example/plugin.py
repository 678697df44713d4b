"""The entry-point module: aisafety registers it and calls these hooks.

Each hook returns a list of classes; a hook this plugin does not need (datasets here) is
simply not defined. Hook names must match the list in docs/plugins.md exactly: a misspelt
hook makes the whole plugin fail to load (``aisafety plugins`` shows why). Everything is
imported from ``aisafety.plugin``, the one public module for plugins.
"""

from __future__ import annotations

from aisafety.plugin import Attack, InputDefense, Metric, hookimpl
from aisafety_example.gaussian_blur import GaussianBlur
from aisafety_example.mean_margin import MeanMargin
from aisafety_example.uniform_noise import UniformNoiseLinf


@hookimpl
def aisafety_attacks() -> list[type[Attack]]:
    return [UniformNoiseLinf]


@hookimpl
def aisafety_defenses() -> list[type[InputDefense]]:
    return [GaussianBlur]


@hookimpl
def aisafety_metrics() -> list[type[Metric]]:
    return [MeanMargin]
