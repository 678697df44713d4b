"""Loss gradients with respect to the input, shared by every white-box attack."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from aisafety.attack.losses import LossFn
from aisafety.attack.threat import normalized

__all__ = [
    "class_jacobian",
    "cross_entropy_gradient",
    "eot_loss_gradient",
    "iterate",
    "loss_gradient",
    "normalized",  # re-exported: it lives with the threat models now
    "require_finite_budget",
]
from aisafety.errors import InputError
from aisafety.prediction.base import Predictor


def cross_entropy_gradient(
    predictor: Predictor, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """d(sum of CE losses)/dx and the logits, in one forward and one backward pass.

    Summing (not averaging) keeps each sample's gradient independent of the batch size.
    ``watched_logits`` skips the input check: the attack checked the clean batch once already.
    With ``target``, the gradient of ``-CE(logits, target)``: ascending it moves towards the
    target class (the negation is exact, so a targeted step is the mirror of a descent step).
    """
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        logits = predictor.watched_logits(x)
        loss = F.cross_entropy(logits, y if target is None else target, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x)
    return (grad if target is None else -grad), logits.detach()


def loss_gradient(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    target: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """d(sum of per-sample losses)/dx, the logits and the per-sample losses (all detached).

    ``loss_fn(logits, y, target)`` returns one loss per sample to maximise (see
    ``aisafety.attack.losses``; ``target`` is None for an untargeted attack).
    """
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        logits = predictor.watched_logits(x)
        loss = loss_fn(logits, y) if target is None else loss_fn(logits, y, target)
        (grad,) = torch.autograd.grad(loss.sum(), x)
    return grad, logits.detach(), loss.detach()


def eot_loss_gradient(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    target: torch.Tensor | None = None,
    draws: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``loss_gradient`` averaged over ``draws`` forward passes (Expectation over
    Transformation, Athalye et al. 2018): for a randomised model each pass draws its own
    randomness, and the mean gradient follows the expected loss. The logits and losses are
    the last draw's, as in AutoAttack's APGD with ``eot_iter``; one draw is ``loss_gradient``."""
    grad, logits, loss = loss_gradient(predictor, x, y, loss_fn, target)
    for _ in range(draws - 1):
        more, logits, loss = loss_gradient(predictor, x, y, loss_fn, target)
        grad = grad + more
    return (grad / draws if draws > 1 else grad), logits, loss


def class_jacobian(
    predictor: Predictor, x: torch.Tensor, classes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the logits of ``classes`` (n, k) per sample: shape (n, k, *x.shape[1:]).

    One forward pass and k backward passes over the whole batch (not one per sample): the
    logit of sample i only depends on input i, so the gradient of the batch sum of column j
    holds every sample's own gradient. Returns the jacobian and the (detached) logits.
    """
    rows = []
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        logits = predictor.watched_logits(x)
        picked = logits.gather(1, classes)
        for j in range(classes.shape[1]):
            (grad,) = torch.autograd.grad(
                picked[:, j].sum(), x, retain_graph=j + 1 < classes.shape[1]
            )
            rows.append(grad)
    return torch.stack(rows, dim=1), logits.detach()


def iterate(
    predictor: Predictor,
    x_start: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    early_stop: bool,
    update: Callable[[torch.Tensor | slice, torch.Tensor, torch.Tensor], torch.Tensor],
    target: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop shared by iterative cross-entropy attacks (BIM, MI-FGSM, PGD-l2, PGD-l1).

    Each step takes the CE gradient at the current point of every active sample and replaces
    that point by ``update(active, x_active, grad)``; ``active`` indexes the batch (a slice
    when every sample is active), so an update with per-sample state (momentum) can index
    it. With ``early_stop`` a sample leaves the active set as soon as it is misclassified.

    Returns the points and the number of moves made per sample. The point of a sample is its
    final iterate, unless an iterate the loop evaluated was misclassified: then the last such
    iterate (as APGD does), so a later step that wanders back to the true class cannot undo
    a success the attack already found. The logits come with the gradient, so this is free.
    With ``target`` the gradient is that of ``-CE(target)`` (towards the target class);
    success and early stop are still misclassification.
    """
    x_adv = x_start.clone()
    found = torch.zeros(len(x_adv), dtype=torch.bool, device=x_adv.device)
    x_found = x_adv.clone()
    moves = torch.zeros(len(x_adv), dtype=torch.long, device=x_adv.device)
    active: torch.Tensor | slice = (
        torch.arange(len(x_adv), device=x_adv.device) if early_stop else slice(None)
    )
    for _ in range(steps):
        current = x_adv[active]
        aim = None if target is None else target[active]
        grad, logits = cross_entropy_gradient(predictor, current, y[active], aim)
        wrong = logits.argmax(1) != y[active]
        if early_stop:
            active, grad = active[~wrong], grad[~wrong]  # type: ignore[index]
            if not len(active):  # type: ignore[arg-type]
                break
        else:
            found |= wrong
            x_found[wrong] = current[wrong]
        moves[active] += 1
        x_adv[active] = update(active, x_adv[active], grad)
    return torch.where(found.view(-1, *([1] * (x_adv.dim() - 1))), x_found, x_adv), moves


def require_finite_budget(attack: str, eps: float) -> None:
    """Budgeted attacks scale their steps with eps: an infinite budget has no meaning there."""
    if not math.isfinite(eps):
        raise InputError(
            f"attack {attack!r} needs a finite budget, got eps={eps}; for an unbounded search "
            "use a minimum-norm attack (deepfool-l2, deepfool-linf, cw-l2)"
        )
