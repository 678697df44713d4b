"""An example aisafety plugin: one attack, one defense, one metric, one file each.

The hook functions that hand these classes to aisafety live in ``aisafety_example.plugin``,
the module named by this package's ``aisafety`` entry point.
"""

from __future__ import annotations

from aisafety_example.gaussian_blur import GaussianBlur
from aisafety_example.mean_margin import MeanMargin
from aisafety_example.uniform_noise import UniformNoiseLinf

__all__ = ["GaussianBlur", "MeanMargin", "UniformNoiseLinf"]
__version__ = "0.1.0"
