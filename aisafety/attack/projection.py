"""The base class's budget guarantee: any candidate an attack returns, put into its budget.

The geometry lives in ``aisafety.attack.threat``, one threat model per norm.
"""

from __future__ import annotations

import torch

from aisafety.attack.threat import project_l1, threat_model
from aisafety.interfaces import Norm

__all__ = ["project", "project_l1"]


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: float, norm: Norm | None) -> torch.Tensor:
    """A point of the ``norm`` ball of radius ``eps`` around ``x`` and of [0, 1] (the closest
    one for l-inf and l1; the box, then the radial shrink, for l2). With no norm, only the box.
    """
    if norm is None:
        return x_adv.clamp(0.0, 1.0)
    return threat_model(norm).contain(x_adv, x, eps)
