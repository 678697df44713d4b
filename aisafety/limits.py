"""Plan checks that need the live attack objects: work limits and budget ranges.

A plan field such as ``steps: 1e12`` validates as an integer, and ``eps: 8`` is a valid
number; both are mistakes that would run for days or measure nothing, so the runner
refuses them before any work, naming the attack, the value and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from aisafety.errors import ConfigError
from aisafety.interfaces import AttackSpec, Norm, WorkLimits


def limit_kind(field: str) -> str | None:
    """Which limit a config field counts against, from its name (plugins included)."""
    name = field.lower()
    if "restart" in name:
        return "restarts"
    if "quer" in name:
        return "queries"
    if name.endswith(("steps", "iterations", "iters", "iter")):
        return "steps"
    return None


def check_work_limits(spec: AttackSpec, config: object, limits: WorkLimits) -> None:
    """Every steps/queries/restarts setting of ``config`` is within ``limits``."""
    for field, value in dict(config).items() if config is not None else ():
        kind = limit_kind(field)
        if kind is None or isinstance(value, bool) or not isinstance(value, int):
            continue
        bound = getattr(limits, kind)
        if value > bound:
            raise ConfigError(
                f"attack {spec.name!r}: {field} = {value:,} is above the limit of {bound:,} "
                f"{kind}; if you mean it, raise it in the plan: 'limits: {{{kind}: {value}}}'"
            )


def largest_budget(norm: Norm, input_shape: Iterable[int]) -> float:
    """The largest distance between two images in [0, 1] of this shape."""
    size = math.prod(input_shape)
    return {Norm.LINF: 1.0, Norm.L2: math.sqrt(size), Norm.L1: float(size)}.get(norm, size)


def check_budgets(spec: AttackSpec, norm: Norm | None, input_shape: Iterable[int]) -> None:
    """Budgets beyond the largest possible distance are a scale mistake (0-255 for 0-1)."""
    if norm is None:  # corruptions: eps is not a budget
        return
    shape = tuple(input_shape)
    bound = largest_budget(norm, shape)
    for eps in spec.eps:
        if eps > bound:
            hint = f" (on the 0-255 scale {eps:g} is {eps / 255:.4g})" if eps >= 1 else ""
            raise ConfigError(
                f"attack {spec.name!r}: budget eps={eps:g} exceeds {bound:g}, the largest "
                f"{norm.value} distance between two images of shape {shape} in [0, 1]; budgets "
                f"are in the [0, 1] pixel scale{hint}"
            )
