"""Projections onto l_p balls around the clean input, intersected with the [0, 1] box."""

from __future__ import annotations

import torch

from aisafety.interfaces import Norm


def _view(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.view(-1, *([1] * (like.dim() - 1)))


def project_l1(delta: torch.Tensor, eps: float) -> torch.Tensor:
    """Euclidean projection of each sample onto the l1 ball (Duchi et al. 2008, sort-based)."""
    flat = delta.flatten(1)
    inside = flat.abs().sum(1) <= eps
    magnitudes, _ = flat.abs().sort(dim=1, descending=True)
    cumulative = magnitudes.cumsum(1)
    ranks = torch.arange(1, flat.shape[1] + 1, device=delta.device, dtype=delta.dtype)
    candidates = magnitudes - (cumulative - eps) / ranks > 0
    rho = candidates.float().cumsum(1).argmax(1, keepdim=True)  # last index where True
    theta = ((cumulative.gather(1, rho) - eps) / (rho + 1).to(delta.dtype)).clamp_min(0)
    shrunk = flat.sign() * (flat.abs() - theta).clamp_min(0)
    return torch.where(inside[:, None], flat, shrunk).view_as(delta)


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: float, norm: Norm | None) -> torch.Tensor:
    """Closest point to ``x_adv`` (for linf and l1; the radial shrink for l2) in the budget.

    The [0, 1] clamp is applied last; for linf it keeps the point inside the ball, for l1/l2
    it can only shrink the perturbation, so the result is always within budget.
    """
    delta = x_adv - x
    if norm is Norm.LINF:
        delta = delta.clamp(-eps, eps)
    elif norm is Norm.L2:
        size = delta.flatten(1).norm(p=2, dim=1)
        factor = torch.where(size > eps, eps / size.clamp_min(1e-12), torch.ones_like(size))
        delta = delta * _view(factor, delta)
    elif norm is Norm.L1:
        delta = project_l1(delta, eps)
    return (x + delta).clamp(0.0, 1.0)
