"""The smoothing distributions and the certified radius each one gives.

Each noise has one scale parameter ``sigma``: the Gaussian's standard deviation, the
Laplace scale b (density exp(-|z| / b) / 2b), or the half-width of the uniform cube
[-sigma, sigma]^d. The radius is the Neyman-Pearson bound for a lower bound ``p_a`` of the
top class's probability when the runner-up gets the rest (p_b = 1 - p_a):

- Gaussian, l2: sigma * Phi^-1(p_a) (Cohen et al. 2019, Theorem 1);
- Laplace, l1: -sigma * log(2 (1 - p_a)) (Teng et al. 2020, Theorem 1: the larger of their
  two terms whenever p_b = 1 - p_a; Yang et al. 2020 show it is tight);
- uniform, l1: 2 sigma (p_a - 1/2) (Yang et al. 2020, Table 1, uniform on the cube).

All are zero at p_a = 1/2 and are only certificates for p_a > 1/2 (CERTIFY abstains below).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import torch

from aisafety import randomness


class Noise(StrEnum):
    GAUSSIAN = "gaussian"
    LAPLACE = "laplace"
    UNIFORM = "uniform"


# The lp norm each noise certifies natively.
CERTIFIED_NORM: dict[Noise, str] = {
    Noise.GAUSSIAN: "l2",
    Noise.LAPLACE: "l1",
    Noise.UNIFORM: "l1",
}


def sample_noise(
    noise: Noise, sigma: float, shape: torch.Size, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """One draw of the noise, from ``generator`` only (so a seed fixes every draw)."""
    if noise is Noise.GAUSSIAN:
        return sigma * randomness.randn(shape, generator, device)
    if noise is Noise.LAPLACE:
        # Laplace(0, b) = b (E1 - E2) for independent standard exponentials.
        e = torch.empty((2, *shape)).exponential_(generator=generator).to(device)
        return sigma * (e[0] - e[1])
    if noise is Noise.UNIFORM:
        return sigma * (2 * randomness.rand(shape, generator, device) - 1)
    raise ValueError(f"unknown noise {noise!r}")


def certified_radius(noise: Noise, sigma: float, p_a: np.ndarray) -> np.ndarray:
    """Radius in the noise's own norm (``CERTIFIED_NORM``); 0 where p_a <= 1/2."""
    p = np.clip(np.asarray(p_a, dtype=np.float64), 0.5, 1.0)
    if noise is Noise.GAUSSIAN:
        from scipy.stats import norm  # here: scipy.stats takes ~0.7 s to import

        radius = sigma * norm.ppf(p)
    elif noise is Noise.LAPLACE:
        with np.errstate(divide="ignore"):
            radius = -sigma * np.log(2 * (1 - p))
    elif noise is Noise.UNIFORM:
        radius = 2 * sigma * (p - 0.5)
    else:
        raise ValueError(f"unknown noise {noise!r}")
    return np.maximum(radius, 0.0)
