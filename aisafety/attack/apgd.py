"""APGD, Auto-PGD (Croce & Hein, ICML 2020, "Reliable evaluation of adversarial robustness
with an ensemble of diverse parameter-free attacks", Algorithm 1), the core of AutoAttack.

PGD with momentum and a step size that adapts itself, so there is nothing to tune:

    z       = P(x_k + eta * s(grad f(x_k)))            s = sign (l-inf) or g/||g||_2 (l2)
    x_{k+1} = P(x_k + a (z - x_k) + (1 - a)(x_k - x_{k-1})),   a = 0.75 (1 at the first step)

starting from a random point on the eps-sphere with eta = 2 eps. At the checkpoints
``w_j = ceil(p_j * steps)``, ``p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03,
0.06)`` (rounded as in the authors' code, see ``checkpoints``), a sample's step size is
halved and its iterate restarted from the best point found so far (highest loss) when

1. the loss went up in at most ``rho`` = 75 % of the steps since the last checkpoint (the
   authors' code compares with ``<=``; the paper writes ``<``), or
2. its step size was not halved at the last checkpoint and its best loss has not improved.

``n_restarts`` runs from fresh random starts are spent on the samples not fooled yet
("cheap" restarts of the reference code). The returned point is the last misclassified
iterate where there is one, else the highest-loss point. Losses (``aisafety.attack.losses``):
cross-entropy (``apgd-ce``), the Difference of Logits Ratio (``apgd-dlr``, the paper's new
loss), and the margin ``max_{i != y} z_i - z_y`` (``apgd-mar``). l-inf and l2 versions are
separate names because the norm is part of an attack's identity.

``steps`` counts the moves per sample (one gradient each, plus one at every random start).
``eot_iter`` > 1 averages that many gradients per move (Expectation over Transformation, for
randomised models: AutoAttack's ``rand`` version uses 20).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import eot_loss_gradient, require_finite_budget
from aisafety.attack.losses import LOSSES
from aisafety.attack.streams import SampleStreams
from aisafety.attack.threat import per_sample
from aisafety.attack.work import counted
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

# Whether the early stop keeps its batch in buckets (``_next_batch``): None for a GPU only, where
# each new batch size costs cuDNN plans; on the CPU the rows riding along would be extra work
BUCKETS: bool | None = None


class APGDConfig(AttackConfig):
    steps: int = Field(default=100, gt=0, description="iterations per restart (N_iter)")
    n_restarts: int = Field(default=1, gt=0, description="random restarts on unfooled samples")
    rho: float = Field(default=0.75, gt=0, le=1, description="checkpoint condition 1 threshold")
    momentum: float = Field(default=0.75, ge=0, le=1, description="weight a of the new step")
    early_stop: bool = Field(
        default=False, description="stop moving a sample once it is misclassified"
    )
    eot_iter: int = Field(
        default=1, gt=0, description="gradients averaged per step (EOT, randomised models)"
    )


def checkpoints(steps: int) -> list[int]:
    """The iterations w_j > 0 where the step size is reviewed.

    The paper (Section 3.2) sets ``w_j = ceil(p_j * steps)`` with ``p_1 = 0.22`` and the gap
    between checkpoints shrinking by 0.03 per checkpoint down to 0.06. This follows the
    authors' code (``auto-attack``, ``APGDAttack.attack_single_run``), which rounds the first
    gap, the decrement and the minimum gap down to whole iterations (at least 1): identical
    for 100 steps (22, 41, 57, 70, 80, 87, 93, 99), and for few steps it keeps reviewing the
    step size often instead of rounding the decrement up to a whole iteration.
    """
    gap = max(int(0.22 * steps), 1)
    decrement, smallest = max(int(0.03 * steps), 1), max(int(0.06 * steps), 1)
    marks, mark = [], gap
    while mark <= steps:
        marks.append(mark)
        gap = max(gap - decrement, smallest)
        mark += gap
    return marks


class _Restarts:
    """What the restarts of one call share: the output, best loss, fooled and steps per sample."""

    def __init__(self, x: torch.Tensor):
        self.x_out = x.clone()
        self.best_loss = torch.full((len(x),), -torch.inf, device=x.device)
        self.fooled = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        self.steps = torch.zeros(len(x), dtype=torch.long, device=x.device)


class _APGD(Attack):
    family = AttackFamily.GRADIENT
    requires = Capability.GRADIENTS
    chunk_independent = True
    Config = APGDConfig
    loss: ClassVar[str]
    targeted = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_finite_budget(self.name, eps)
        state = _Restarts(x)
        self._restart(predictor, x, y, eps, call.streams, call.target, state)
        return state.x_out, state.steps

    def _restart(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        streams: SampleStreams,
        target: torch.Tensor | None,
        state: _Restarts,
    ) -> None:
        """``n_restarts`` runs on the samples of ``state`` not fooled yet, updating it."""
        for _ in counted("restart", self.config.n_restarts):
            todo = (~state.fooled).nonzero().squeeze(1)
            if not len(todo):
                break
            aim = None if target is None else target[todo]
            x_best, x_adv, run_fooled, loss, moves = self._run(
                predictor, x[todo], y[todo], eps, streams[todo], aim
            )
            state.steps[todo] += moves
            keep = run_fooled | (loss > state.best_loss[todo])
            state.x_out[todo[keep]] = torch.where(
                per_sample(run_fooled[keep], x_adv), x_adv[keep], x_best[keep]
            )
            state.best_loss[todo] = torch.maximum(state.best_loss[todo], loss)
            state.fooled[todo] = run_fooled

    # --- one run -----------------------------------------------------------------------------

    def _run(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        streams: SampleStreams,
        target: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One APGD run: best-loss points, adversarial points, fooled, best loss, moves.

        With ``target`` the loss is the targeted one (towards ``target``); fooled still
        means misclassified, as in AutoAttack's APGD-T."""
        cfg = self.config
        n, device = len(x), x.device
        loss_fn = LOSSES[self.loss]
        threat = self.threat

        def aim(rows: torch.Tensor | slice) -> torch.Tensor | None:
            return None if target is None else target[rows]

        x_adv = threat.random_start(x, eps, streams, surface=True)
        grad, logits, loss = eot_loss_gradient(predictor, x_adv, y, loss_fn, target, cfg.eot_iter)
        fooled = logits.argmax(1) != y
        x_found = torch.where(per_sample(fooled, x), x_adv, x)
        x_best, loss_best, grad_best = x_adv.clone(), loss.clone(), grad.clone()
        x_prev, loss_prev = x_adv.clone(), loss.clone()
        eta = torch.full((n,), 2.0 * eps, device=device)
        increases = torch.zeros(n, device=device)
        loss_best_at_check = loss_best.clone()
        reduced_at_check = torch.ones(n, dtype=torch.bool, device=device)
        moves = torch.zeros(n, dtype=torch.long, device=device)
        marks, last_mark = set(checkpoints(cfg.steps)), 0

        idx, live = torch.arange(n, device=device), None
        buckets = cfg.early_stop and (BUCKETS if BUCKETS is not None else device.type == "cuda")
        if cfg.early_stop:
            idx, live = _next_batch(idx, fooled, buckets)
        for k in counted("iteration", cfg.steps):
            if not len(idx):
                break
            xa, x0 = x_adv[idx], x[idx]
            step = per_sample(eta[idx], xa) * threat.ascent(grad[idx])
            z = threat.project(xa + step, x0, eps)
            a = cfg.momentum if k > 0 else 1.0
            x_new = threat.project(xa + a * (z - xa) + (1 - a) * (xa - x_prev[idx]), x0, eps)
            x_prev[idx], x_adv[idx] = xa, x_new
            g, logits, current = eot_loss_gradient(
                predictor, x_new, y[idx], loss_fn, aim(idx), cfg.eot_iter
            )
            grad[idx] = g
            moves[idx] += 1 if live is None else live

            # the bookkeeping by ``where`` over the active rows: a boolean mask would cost a
            # device synchronisation each (seven a step on a GPU, docs/gpu.md). Rows fooled
            # already (``live`` False) ride along: their state moves, their results do not
            wrong = logits.argmax(1) != y[idx]
            if live is not None:
                wrong &= live
            x_found[idx] = torch.where(per_sample(wrong, x_new), x_new, x_found[idx])
            fooled[idx] = fooled[idx] | wrong
            increases[idx] += (current > loss_prev[idx]).float()
            loss_prev[idx] = current
            better = current > loss_best[idx]
            if live is not None:
                better &= live
            kept = per_sample(better, x_new)
            x_best[idx] = torch.where(kept, x_new, x_best[idx])
            grad_best[idx] = torch.where(kept, g, grad_best[idx])
            loss_best[idx] = torch.where(better, current, loss_best[idx])

            if k + 1 in marks and k + 1 < cfg.steps:
                no_progress = increases[idx] <= cfg.rho * (k + 1 - last_mark)
                stalled = ~reduced_at_check[idx] & (loss_best_at_check[idx] >= loss_best[idx])
                reduce = no_progress | stalled
                halved = idx[reduce]
                eta[halved] /= 2
                x_adv[halved], grad[halved] = x_best[halved], grad_best[halved]
                reduced_at_check[idx] = reduce
                loss_best_at_check[idx] = loss_best[idx]
                increases[idx] = 0
                last_mark = k + 1
            if cfg.early_stop:
                idx, live = _next_batch(idx, fooled, buckets)
        return x_best, x_found, fooled, loss_best, moves


def _next_batch(
    idx: torch.Tensor, fooled: torch.Tensor, buckets: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The early stop's next batch and which of its rows still move (None: all).

    Without ``buckets`` the rows not fooled yet, a new batch size at almost every step. With
    them the batch is kept until its open rows fit a power of two below its size, then cut
    to that power: the open rows, then fooled ones riding along (frozen: ``_run`` writes
    none of their results). A GPU then meets few batch sizes, shared across runs and
    targets, each a cuDNN plan per convolution and direction (docs/gpu.md)."""
    open_ = ~fooled[idx]
    if not buckets:
        return idx[open_], None
    count = int(open_.sum())  # the one synchronisation a step, as the mask's nonzero
    size = 1 << max(count - 1, 0).bit_length()  # the smallest power of two >= count
    if count == 0:
        return idx[:0], open_[:0]
    if size >= len(idx):
        return idx, open_
    order = torch.argsort(open_.byte(), descending=True, stable=True)[:size]
    return idx[order], open_[order]


class APGDCE(_APGD):
    name = "apgd-ce"
    norm = Norm.LINF
    loss = "ce"
    description = "Auto-PGD with cross-entropy loss, l-inf (Croce & Hein 2020)"


class APGDDLR(_APGD):
    name = "apgd-dlr"
    norm = Norm.LINF
    loss = "dlr"
    description = "Auto-PGD with the Difference of Logits Ratio loss, l-inf (Croce & Hein 2020)"


class APGDMargin(_APGD):
    name = "apgd-mar"
    norm = Norm.LINF
    loss = "margin"
    description = "Auto-PGD with the margin (CW) loss, l-inf (Croce & Hein 2020)"


class APGDCEL2(_APGD):
    name = "apgd-ce-l2"
    norm = Norm.L2
    loss = "ce"
    description = "Auto-PGD with cross-entropy loss, l2 (Croce & Hein 2020)"


class APGDDLRL2(_APGD):
    name = "apgd-dlr-l2"
    norm = Norm.L2
    loss = "dlr"
    description = "Auto-PGD with the Difference of Logits Ratio loss, l2 (Croce & Hein 2020)"


class APGDMarginL2(_APGD):
    name = "apgd-mar-l2"
    norm = Norm.L2
    loss = "margin"
    description = "Auto-PGD with the margin (CW) loss, l2 (Croce & Hein 2020)"


class APGDTConfig(APGDConfig):
    n_target_classes: int = Field(
        default=9, gt=0, description="target classes tried, by decreasing clean logit"
    )


def ranked_targets(clean_logits: torch.Tensor, y: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` classes other than ``y`` with the highest clean logits, best first
    (n, count): AutoAttack's targets ``sort(logits)[:, -k]`` for k = 2 .. count + 1 on a
    correctly classified sample, without ever picking ``y`` itself."""
    others = clean_logits.scatter(1, y[:, None], float("-inf"))
    count = min(count, clean_logits.shape[1] - 1)
    return others.argsort(dim=1, descending=True, stable=True)[:, :count]


class _APGDTargeted(_APGD):
    """APGD-T (Croce & Hein 2020, AutoAttack's second member): the targeted DLR loss towards
    each of the ``n_target_classes`` most likely other classes in turn, ``n_restarts`` runs
    per target, each only on the samples no earlier target fooled. Success stays
    misclassification. Given explicit targets (``call.target``), it runs those alone."""

    Config = APGDTConfig
    loss = "dlr"
    # a sample already misclassified needs no target (and its ranking would start at y)
    skips_misclassified = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if call.target is not None:
            return super().perturb(predictor, x, y, eps, call)
        require_finite_budget(self.name, eps)
        state = _Restarts(x)
        targets = ranked_targets(call.clean_logits, y, self.config.n_target_classes)
        for rank in counted("target", targets.shape[1]):
            self._restart(predictor, x, y, eps, call.streams, targets[:, rank], state)
        return state.x_out, state.steps


class APGDT(_APGDTargeted):
    name = "apgd-t"
    norm = Norm.LINF
    description = "Targeted Auto-PGD, targeted DLR loss over the top-9 other classes, l-inf"


class APGDTL2(_APGDTargeted):
    name = "apgd-t-l2"
    norm = Norm.L2
    description = "Targeted Auto-PGD, targeted DLR loss over the top-9 other classes, l2"
