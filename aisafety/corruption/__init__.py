"""Common corruptions and perturbation sequences (Hendrycks & Dietterich, ICLR 2019).

- ``corrupt(x, name, severity, seed=0)``: one of the 19 CIFAR-10-C corruptions
  (``CORRUPTIONS``, grouped in ``CATEGORIES``) at severity 1..5, batched torch on the
  tensors' device;
- ``sequence(x, name, n_frames=31, seed=0)``: CIFAR-10-P-style perturbation sequences
  (``SEQUENCES``), shape (N, T, C, H, W);

Tables and every deviation from the reference code: ``docs/corruptions.md``.
"""

from aisafety.corruption.base import CATEGORIES, CORRUPTIONS, SEVERITIES, corrupt
from aisafety.corruption.sequences import NOISE_SEQUENCES, SEQUENCES, sequence

__all__ = [
    "CATEGORIES",
    "CORRUPTIONS",
    "NOISE_SEQUENCES",
    "SEQUENCES",
    "SEVERITIES",
    "corrupt",
    "sequence",
]
