"""The adversarial frontier (Guo et al., "Exploring the adversarial frontier", Section III-B):
per sample, the lowest confidence margin an attack reaches at each budget of a grid.

The margin is the paper's eq. 3 on *probabilities*: MAR = p_y - max_{i != y} p_i, clamped at
0 (L_MAR_conf; a misclassified point scores 0). The search is APGD (Croce & Hein 2020) on a
margin (the paper's APGD-MAR): by default the logit margin, whose gradient does not vanish
when the softmax saturates (the probability margin's search reports a distilled model as far
more robust than it is, docs/metrics.md), with the probability margin of every iterate
recorded; ``loss="prob"`` searches on the probability margin itself. It is run through the
ascending budgets eps_1 < ... < eps_N *warm-started*: budget i starts from the lowest-margin
point found so far, which lies inside its larger ball, so each budget needs only a few steps
and the whole grid costs about one attack. The paper's Algorithm 1 runs an independent
attack per budget instead.

The frontier is made monotone non-increasing: a point found at a smaller budget is also
admissible at every larger one, so F(eps_i) = min over budgets <= eps_i. A sample whose margin
reaches 0 is done (0 at every larger budget) and leaves the search. No random numbers are
drawn: the result is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from aisafety.attack.apgd import checkpoints
from aisafety.attack.gradients import normalized
from aisafety.attack.projection import project
from aisafety.interfaces import Norm
from aisafety.prediction.base import Predictor

SearchLoss = Literal["prob", "logit"]


def probability_margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MAR of eq. 3: p_y - max_{i != y} p_i per sample (negative once misclassified)."""
    probs = torch.softmax(logits, dim=1)
    true = probs.gather(1, y[:, None]).squeeze(1)
    others = probs.scatter(1, y[:, None], -1.0).amax(1)
    return true - others


def logit_margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    true = logits.gather(1, y[:, None]).squeeze(1)
    return true - logits.scatter(1, y[:, None], float("-inf")).amax(1)


@dataclass(frozen=True)
class Frontier:
    """``margins[i, j]``: sample i's clamped, monotone margin at ``budgets[j]`` (budgets[0] = 0)."""

    budgets: tuple[float, ...]
    margins: torch.Tensor  # (n, N + 1), float64, in [0, 1]
    gradients: torch.Tensor  # (n,) gradient evaluations spent per sample


@dataclass
class _Search:
    """Per-sample state of the search, on the samples still above margin 0."""

    x: torch.Tensor  # clean inputs
    y: torch.Tensor
    point: torch.Tensor  # lowest-margin point so far (the frontier point)
    grad: torch.Tensor  # attack-loss gradient at ``point``
    loss: torch.Tensor  # attack loss at ``point``
    margin: torch.Tensor  # probability margin at ``point``


def _evaluate(predictor: Predictor, x: torch.Tensor, y: torch.Tensor, loss: SearchLoss):
    """Gradient of the attack loss (to *maximise*: minus the margin), the loss and the
    probability margin, from one forward and one backward pass."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        logits = predictor.watched_logits(x)
        prob = probability_margin(logits, y)
        objective = -(prob if loss == "prob" else logit_margin(logits, y))
        (grad,) = torch.autograd.grad(objective.sum(), x)
    return grad, objective.detach(), prob.detach()


def _step_direction(grad: torch.Tensor, norm: Norm) -> torch.Tensor:
    return grad.sign() if norm is Norm.LINF else normalized(grad, 2)


def _apgd_budget(
    predictor: Predictor,
    state: _Search,
    eps: float,
    norm: Norm,
    steps: int,
    loss: SearchLoss,
    rho: float = 0.75,
    momentum: float = 0.75,
) -> None:
    """APGD (Croce & Hein 2020, Algorithm 1) inside the eps-ball, started from ``state.point``
    (no random start); updates the frontier point of every sample in place."""
    n, device = len(state.x), state.x.device
    view = (-1,) + (1,) * (state.x.dim() - 1)
    x_cur, grad = state.point.clone(), state.grad.clone()
    x_prev, loss_prev = x_cur.clone(), state.loss.clone()
    x_best, grad_best, loss_best = x_cur.clone(), grad.clone(), state.loss.clone()
    eta = torch.full((n,), 2.0 * eps, device=device)
    increases = torch.zeros(n, device=device)
    loss_at_check = loss_best.clone()
    reduced_at_check = torch.ones(n, dtype=torch.bool, device=device)
    marks, last_mark = set(checkpoints(steps)), 0
    for k in range(steps):
        z = project(x_cur + eta.view(view) * _step_direction(grad, norm), state.x, eps, norm)
        a = momentum if k > 0 else 1.0
        x_new = project(x_cur + a * (z - x_cur) + (1 - a) * (x_cur - x_prev), state.x, eps, norm)
        x_prev, x_cur = x_cur, x_new
        grad, current, margin = _evaluate(predictor, x_cur, state.y, loss)
        increases += (current > loss_prev).float()
        loss_prev = current
        better = current > loss_best
        x_best[better], grad_best[better], loss_best[better] = (
            x_cur[better], grad[better], current[better]
        )  # fmt: skip
        lower = margin < state.margin
        state.point[lower], state.grad[lower] = x_cur[lower], grad[lower]
        state.loss[lower], state.margin[lower] = current[lower], margin[lower]
        if k + 1 in marks and k + 1 < steps:
            reduce = (increases <= rho * (k + 1 - last_mark)) | (
                ~reduced_at_check & (loss_at_check >= loss_best)
            )
            eta[reduce] /= 2
            x_cur[reduce], grad[reduce] = x_best[reduce], grad_best[reduce]
            reduced_at_check, loss_at_check = reduce, loss_best.clone()
            increases.zero_()
            last_mark = k + 1


def adversarial_frontier(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    budgets: tuple[float, ...],
    norm: Norm,
    steps: int,
    loss: SearchLoss = "logit",
) -> Frontier:
    """The frontier of every sample at 0 and at ``budgets`` (ascending), ``steps`` APGD steps
    per budget, warm-started from the previous budget's frontier point."""
    if list(budgets) != sorted(budgets) or budgets[0] <= 0:
        raise ValueError(f"budgets must be positive and ascending, got {budgets}")
    x, y = x.to(predictor.device), y.to(predictor.device, torch.long)
    n = len(x)
    margins = torch.zeros(n, len(budgets) + 1, dtype=torch.float64)
    gradients = torch.ones(n, dtype=torch.long)
    grad, current, margin = _evaluate(predictor, x, y, loss)
    margins[:, 0] = margin.double().clamp_min(0).cpu()
    state = _Search(x, y, x.clone(), grad, current, margin)
    alive = torch.arange(n, device=x.device)
    for j, eps in enumerate(budgets, start=1):
        keep = state.margin > 0
        if not keep.all():
            alive = alive[keep]
            state = _Search(*(t[keep] for t in vars(state).values()))
        if not len(alive):
            break
        _apgd_budget(predictor, state, eps, norm, steps, loss)
        gradients[alive.cpu()] += steps
        margins[alive.cpu(), j] = state.margin.double().clamp_min(0).cpu()
    # running minimum: the lowest margin found at any budget up to this one
    margins = torch.cummin(margins, dim=1).values
    return Frontier(tuple(float(b) for b in budgets), margins, gradients)
