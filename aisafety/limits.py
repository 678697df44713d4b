"""Plan checks that need the live attack objects: work limits and budget ranges.

A plan field such as ``steps: 1e12`` validates as an integer, and ``eps: 8`` is a valid
number; both are mistakes that would run for days or measure nothing, so the runner
refuses them before any work, naming the attack, the value and the fix.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable

from aisafety.errors import AISafetyWarning, ConfigError
from aisafety.interfaces import AttackSpec, Norm, WorkLimits

GIB = 1 << 30


def limit_kind(field: str, draws: bool = True) -> str | None:
    """Which limit a config field counts against, from its name (plugins included);
    ``draws``: whether ``samples`` counts random draws (not a metric's subset size)."""
    name = field.lower()
    if "eot" in name:
        return "eot_samples"
    if "population" in name:
        return "population"
    if name.startswith("n_") and "target" in name:
        return "targets"
    if name in ("n", "n0") or (draws and name == "samples"):
        return "samples"
    if "restart" in name:
        return "restarts"
    if "quer" in name:
        return "queries"
    if name.endswith(("steps", "iterations", "iters", "iter")):
        return "steps"
    return None


def _counts(config: object, draws: bool = True) -> Iterable[tuple[str, str, int]]:
    """(field, limit kind, value) of every integer setting of ``config`` a limit covers."""
    for field, value in dict(config).items() if config is not None else ():
        kind = limit_kind(field, draws)
        if kind is not None and isinstance(value, int) and not isinstance(value, bool):
            yield field, kind, value


def check_work_limits(
    spec: AttackSpec | str, config: object, limits: WorkLimits, draws: bool = True
) -> None:
    """Every count ``config`` sets (steps, queries, restarts, draws, EOT copies, population,
    targets) is within ``limits``; ``spec`` is the attack, or a label such as "metric 'x'"."""
    label = spec if isinstance(spec, str) else f"attack {spec.name!r}"
    for field, kind, value in _counts(config, draws):
        bound = getattr(limits, kind)
        if value > bound:
            raise ConfigError(
                f"{label}: {field} = {value:,} is above the limit of {bound:,} "
                f"{kind}; if you mean it, raise it in the plan: 'limits: {{{kind}: {value}}}'"
            )


def machine_memory() -> int:
    """The machine's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_memory(
    label: str, config: object, limits: WorkLimits, batch_size: int, input_shape: Iterable[int]
) -> None:
    """Refuse, before anything is allocated, a setting whose copies of the inputs would not
    fit: EOT copies of a whole batch, or one image's population of candidates (float32)."""
    shape = tuple(input_shape)
    image = math.prod(shape) * 4
    cap = limits.memory_gib * GIB if limits.memory_gib is not None else machine_memory()
    for field, kind, value in _counts(config):
        if kind == "eot_samples":
            need, what = batch_size * value * image, f"{batch_size} images x {value:,} copies"
        elif kind == "population":
            need, what = value * image, f"{value:,} candidates of one image"
        else:
            continue
        if cap and need > cap:
            raise ConfigError(
                f"{label}: {field} = {value:,} needs about {need / GIB:,.1f} GiB ({what} of "
                f"shape {shape}, float32), above the {cap / GIB:,.1f} GiB limit "
                "(limits.memory_gib, default this machine's memory); lower it or batch_size, "
                f"or raise 'limits: {{memory_gib: ...}}' if the memory is there"
            )


def check_targets(label: str, config: object, num_classes: int) -> None:
    """A targeted attack has at most ``num_classes - 1`` classes to aim at."""
    for field, kind, value in _counts(config):
        if kind == "targets" and value > num_classes - 1:
            raise ConfigError(
                f"{label}: {field} = {value} but the model has {num_classes} classes, so at "
                f"most {num_classes - 1} targets; use {field}: {num_classes - 1} or less"
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
    warn_default_budget(spec, shape)
    bound = largest_budget(norm, shape)
    for eps in spec.eps:
        if eps > bound:
            hint = f" (on the 0-255 scale {eps:g} is {eps / 255:.4g})" if eps >= 1 else ""
            raise ConfigError(
                f"attack {spec.name!r}: budget eps={eps!r} exceeds {bound:.10g}, the largest "
                f"{norm.value} distance between two images of shape {shape} in [0, 1]; budgets "
                f"are in the [0, 1] pixel scale{hint}"
            )


DEFAULT_BUDGET_SHAPE = (1, 28, 28)  # the images the default eps 0.1 was chosen for: MNIST's


def warn_default_budget(spec: AttackSpec, shape: tuple[int, ...]) -> None:
    """An attack without ``eps`` runs at 0.1, MNIST's l-inf budget. On a colour or larger
    image that is 25.5/255 (six times ImageNet's usual 4/255), a robust accuracy near 0
    that reads as measured; an l2 budget of 0.1 there is far below any usual one. Silent
    before session 21 (an ImageNet user's audit); now a warning naming the value to write."""
    if "eps" in spec.model_fields_set or shape == DEFAULT_BUDGET_SHAPE:
        return
    warnings.warn(
        f"attack {spec.name!r} gives no eps, so it runs at the default {spec.eps[0]:g}, a "
        f"budget chosen for MNIST's 1x28x28 images; on these {'x'.join(map(str, shape))} "
        "images give the budget you mean in the plan (l-inf: 8/255 = 0.03137 is CIFAR-10's "
        "usual, 4/255 = 0.01569 ImageNet's), e.g. eps: [0.01569]",
        AISafetyWarning,
        stacklevel=3,
    )
