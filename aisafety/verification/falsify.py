"""Looking for counterexamples, and replaying them through the real predictor.

A verifier's candidate (a corner its relaxation points at, an attack's point, a MILP
solution) counts only after ``replay``: it is moved into the box in the predictor's own
float32 inputs, run through the predictor, and kept only if it is inside the box and some
row ``C f + d`` is < 0 there, or = 0 where the tie violates it (``Property.violated``: a
robustness property's tie only where ``argmax`` would not answer the label).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from aisafety.verification.deadline import check_time
from aisafety.verification.property import Property

Model = Callable[[torch.Tensor], torch.Tensor]


def into_box(x: torch.Tensor, prop: Property) -> torch.Tensor:
    """``x`` as float32 in the box: clamped, nudged one float step where rounding left it.
    The box is the property's before any narrowing (``Property.original``)."""
    prop = prop.original
    lower, upper = prop.lower.to(torch.float64), prop.upper.to(torch.float64)
    x32 = x.to(torch.float64).clamp(lower, upper).float()
    wide = x32.double()
    # one float step up or down (towards +-inf: a box end outside [-1, 2] is no exception)
    x32 = torch.where(wide < lower, torch.nextafter(x32, torch.full_like(x32, torch.inf)), x32)
    x32 = torch.where(wide > upper, torch.nextafter(x32, torch.full_like(x32, -torch.inf)), x32)
    return x32


def checked(model: Model, prop: Property, candidates: torch.Tensor):
    """Per sample, the point ``replay`` checks (float32, inside the box) and the lowest
    row's value there: a falsified sample's counterexample and margin, whichever search
    found the point, so the margin printed is the one at the point printed."""
    prop = prop.original  # an outward narrowing's box and offsets would admit false points
    points = into_box(candidates, prop)
    with torch.no_grad():
        values = prop.rows(model(points).to(torch.float64)).amin(1)
    return points, values


def replay(model: Model, prop: Property, candidates: torch.Tensor) -> torch.Tensor:
    """True per sample where the candidate is in the box and violates the property (the
    property before any narrowing: ``Property.original``)."""
    prop = prop.original
    x = into_box(candidates, prop)
    with torch.no_grad():
        violated = prop.violated(model(x).to(torch.float64))
    return prop.inside(x) & violated


def pgd_on_rows(
    model: Model,
    prop: Property,
    steps: int = 50,
    restarts: int = 1,
    seed: int = 0,
    corners: bool = False,
    start: torch.Tensor | None = None,
    fine: bool = False,
) -> torch.Tensor:
    """Signed-gradient descent on min_k (C f + d)_k inside the box; the lowest point found.

    The platform's attacks take labels, not spec rows, so VNN-LIB properties need this
    small box-PGD; its points are only candidates until ``replay`` confirms them. Starts:
    the centre, with ``corners`` the box's lowest and highest corners, then ``restarts``
    random points (the loss is the margin itself: the lowest row); ``start`` replaces the
    centre (branch and bound attacks from its most promising domains' corners). With
    ``fine`` the random restarts take pgd-linf's steps and a soft minimum (below).
    """
    lower, upper = prop.lower.float(), prop.upper.float()
    width = upper - lower
    best = (lower + upper) / 2 if start is None else start.float().clamp(lower, upper)
    best_value = _lowest_row(model, prop, best)
    starts = [best.clone()] + ([lower.clone(), upper.clone()] if corners else [])
    coarse = len(starts) if fine else len(starts) + restarts
    starts += random_starts(lower, upper, restarts, seed)
    # each row's own box sets its step (rows of a radius search have different widths):
    # a quarter of the box, halved twice; with ``fine``, from random points Madry et al.'s
    # 2.5 radius / steps per pixel, as pgd-linf (whose points the coarse steps missed on a
    # CIFAR ResNet)
    first_step = width.flatten(1).amax(1).reshape(-1, *([1] * (width.dim() - 1))) / 4
    small_step = 1.25 * width / max(1, steps)
    for n, x in enumerate(starts):
        step = first_step if n < coarse else small_step
        for t in range(steps):
            check_time()  # a verifier's per-instance limit; no-op for the radius search
            x = x.detach().requires_grad_(True)
            with torch.enable_grad():
                rows = prop.rows(model(x).double())
                value = rows.amin(1)
                # fine: the soft minimum of the rows (every row pulls, as cross-entropy
                # does for pgd-linf); otherwise the minimum
                loss = value if n < coarse else -torch.logsumexp(-rows, 1)
                (grad,) = torch.autograd.grad(loss.sum(), x)
            with torch.no_grad():
                best, best_value = _keep_lower(x, value, best, best_value)
                x = torch.minimum(torch.maximum(x - step * grad.sign(), lower), upper)
                if t in (steps // 2, 3 * steps // 4):
                    step = step / 2
        best, best_value = _keep_lower(x, _lowest_row(model, prop, x), best, best_value)
    return best.detach()


def random_starts(
    lower: torch.Tensor, upper: torch.Tensor, restarts: int, seed: int = 0
) -> list[torch.Tensor]:
    """``restarts`` random points of each sample's box: the same uniform draws of one
    sample's shape for every sample, scaled to its box, so a sample's starts, and so its
    falsification, are the same alone and in any batch, in any order. (One generator drew
    the whole batch's before, and a sample got the draws its position left over. A sample
    alone gets the draws it got before: a one-sample property's attack is unchanged.)"""
    generator = torch.Generator().manual_seed(seed)
    shape = (1, *lower.shape[1:])
    draws = [torch.rand(shape, generator=generator) for _ in range(restarts)]
    return [lower + (upper - lower) * d.to(lower.device, lower.dtype) for d in draws]


def _lowest_row(model: Model, prop: Property, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return prop.rows(model(x).double()).amin(1)


def _keep_lower(
    x: torch.Tensor, value: torch.Tensor, best: torch.Tensor, best_value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample, ``x`` where its lowest row is below the best so far."""
    better = value < best_value
    return torch.where(_expand(better, x), x.detach(), best), torch.where(better, value, best_value)


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.reshape(-1, *([1] * (like.dim() - 1)))
