"""FAB-T, the targeted Fast Adaptive Boundary attack (Croce & Hein, ICML 2020, "Minimally
distorted adversarial examples with a fast adaptive boundary attack"), AutoAttack's third
member.

FAB looks for the smallest perturbation that crosses the decision boundary between the true
class ``y`` and a target class ``t``. At each step it linearises ``f = z_t - z_y`` at the
current point ``x_k``, giving the hyperplane ``{z : w.z = b}`` with ``w = grad f(x_k)`` and
``b = w.x_k - f(x_k)``, and projects onto it (intersected with the [0, 1] box) both the
current point and the clean input: ``d_k`` and ``d_0``. The next point is the biased mix

    x_{k+1} = clip((1 - a)(x_k + eta d_k) + a (x + eta d_0))
    a = min(|d_k| / (|d_k| + |d_0|), a_max)

(eta = 1.05 overshoots the boundary a little; a_max = 0.1). When ``x_{k+1}`` is misclassified
it is kept if it is the smallest such point so far, and the iterate steps back towards ``x``:
``x + beta (x_{k+1} - x)``, beta = 0.9. The projections onto a hyperplane and the box are the
authors' sort-and-bisect algorithms (``projection_linf``, ``projection_l2``), transcribed from
their code (``fab_projections.py`` of ``auto-attack``, MIT licence; torchattacks 3.5.1 carries
the same functions), in batch.

FAB-T runs against the ``n_target_classes`` (9) most likely other classes in turn (by clean
logit), ``n_restarts`` runs per target (the first from ``x``, later ones from a random point
at half the distance of the best point found, or of eps), each only on the samples no earlier
run brought within eps. A sample counts as broken when its smallest misclassified point lies
within eps; the point returned is that smallest point (the base class projects it into the
budget and confirms it), or ``x`` where none was found. ``early_stop`` stops a sample once a
point within eps is found (what a robust-accuracy evaluation needs; off by default, as in the
reference, which keeps shrinking the perturbation).

``steps`` counts the linearisations per sample (one forward and backward pass each, plus one
forward pass to check the new point).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from aisafety.attack.apgd import ranked_targets
from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.gradients import loss_gradient, require_finite_budget
from aisafety.attack.streams import SampleStreams
from aisafety.attack.threat import normalized, per_sample
from aisafety.attack.work import counted
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class FABConfig(AttackConfig):
    steps: int = Field(default=100, gt=0, description="iterations per target and restart")
    n_restarts: int = Field(default=1, gt=0, description="runs per target class")
    n_target_classes: int = Field(
        default=9, gt=0, description="target classes tried, by decreasing clean logit"
    )
    alpha_max: float = Field(default=0.1, ge=0, le=1, description="largest bias towards x")
    eta: float = Field(default=1.05, ge=1, description="overshoot of the projection step")
    beta: float = Field(default=0.9, gt=0, le=1, description="step back towards x on success")
    early_stop: bool = Field(
        default=False, description="stop a sample once a point within eps is found"
    )


def target_margin(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``z_t - z_y``: FAB's linearised function, positive once the target beats the true class."""
    return (logits.gather(1, target[:, None]) - logits.gather(1, y[:, None])).squeeze(1)


def projection_linf(points: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The smallest l-inf step ``d`` (n, d) with ``w.(points + d) = b`` and ``points + d`` in
    [0, 1] (or the step towards the hyperplane as far as the box allows); Croce & Hein's
    algorithm: sort the coordinates by how far they can move, bisect for the active set."""
    t, w, b = points, w.clone(), b.clone()
    sign = 2 * ((w * t).sum(1) - b >= 0) - 1
    w.mul_(sign.unsqueeze(1))
    b.mul_(sign)
    a = (w < 0).to(t.dtype)
    d = (a - t) * (w != 0).to(t.dtype)
    p = a - t * (2 * a - 1)
    indp = torch.argsort(p, dim=1)
    b = b - (w * t).sum(1)
    b0 = (w * d).sum(1)
    indp2 = indp.flip((1,))
    ws = w.gather(1, indp2)
    bs2 = -ws * d.gather(1, indp2)
    s = torch.cumsum(ws.abs(), dim=1)
    sb = torch.cumsum(bs2, dim=1) + b0.unsqueeze(1)
    b2 = sb[:, -1] - s[:, -1] * p.gather(1, indp[:, 0:1]).squeeze(1)
    c_l = b - b2 > 0
    c2 = (b - b0 > 0) & (~c_l)
    lb = torch.zeros(int(c2.sum()), device=t.device)
    ub = torch.full_like(lb, w.shape[1] - 1)
    indp_, sb_, s_, p_, b_ = indp[c2], sb[c2], s[c2], p[c2], b[c2]
    for _ in range(math.ceil(math.log2(w.shape[1]))):
        middle = torch.floor((lb + ub) / 2)
        column = middle.long().unsqueeze(1)
        current = indp_.gather(1, indp_.size(1) - 1 - column)
        b2 = (sb_.gather(1, column) - s_.gather(1, column) * p_.gather(1, current)).squeeze(1)
        above = b_ - b2 > 0
        lb = torch.where(above, middle, lb)
        ub = torch.where(above, ub, middle)
    lb = lb.long()
    if c_l.any():
        lmbd = torch.clamp_min((b[c_l] - sb[c_l, -1]) / (-s[c_l, -1]), min=0).unsqueeze(-1)
        d[c_l] = (2 * a[c_l] - 1) * lmbd
    lmbd = torch.clamp_min((b[c2] - sb[c2, lb]) / (-s[c2, lb]), min=0).unsqueeze(-1)
    d[c2] = torch.min(lmbd, d[c2]) * a[c2] + torch.max(-lmbd, d[c2]) * (1 - a[c2])
    return d * (w != 0).to(t.dtype)


def projection_l2(points: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The smallest l2 step ``d`` with ``w.(points + d) = b`` and ``points + d`` in [0, 1]
    (Croce & Hein's algorithm: sort the coordinates by where they hit the box, bisect)."""
    t, w = points, w.clone()
    c = (w * t).sum(1) - b
    side = 2 * (c >= 0) - 1
    w.mul_(side.unsqueeze(1))
    c = c * side
    r = torch.max(t / w, (t - 1) / w).clamp(min=-1e12, max=1e12)
    r.masked_fill_(w.abs() < 1e-8, 1e12)
    r[r == -1e12] *= -1
    rs, indr = torch.sort(r, dim=1)
    rs2 = torch.nn.functional.pad(rs[:, 1:], (0, 1))
    rs.masked_fill_(rs == 1e12, 0)
    rs2.masked_fill_(rs2 == 1e12, 0)
    w3s = (w**2).gather(1, indr)
    w5 = w3s.sum(dim=1, keepdim=True)
    ws = w5 - torch.cumsum(w3s, dim=1)
    d = -(r * w)
    d.mul_((w.abs() > 1e-8).to(t.dtype))
    s = torch.cat((-w5 * rs[:, 0:1], torch.cumsum((-rs2 + rs) * ws, dim=1) - w5 * rs[:, 0:1]), 1)
    c4 = s[:, 0] + c < 0
    c3 = (d * w).sum(dim=1) + c > 0
    c2 = ~(c4 | c3)
    lb = torch.zeros(int(c2.sum()), device=t.device)
    ub = torch.full_like(lb, w.shape[1] - 1)
    s_, c_ = s[c2], c[c2]
    for _ in range(math.ceil(math.log2(w.shape[1]))):
        middle = torch.floor((lb + ub) / 2)
        above = s_.gather(1, middle.long().unsqueeze(1)).squeeze(1) + c_ > 0
        lb = torch.where(above, middle, lb)
        ub = torch.where(above, ub, middle)
    lb = lb.long()
    if c4.any():
        alpha = c[c4] / w5[c4].squeeze(-1)
        d[c4] = -alpha.unsqueeze(-1) * w[c4]
    if c2.any():
        alpha = (s[c2, lb] + c[c2]) / ws[c2, lb] + rs[c2, lb]
        alpha[ws[c2, lb] == 0] = 0
        c5 = (alpha.unsqueeze(-1) > r[c2]).to(t.dtype)
        d[c2] = d[c2] * c5 - alpha.unsqueeze(-1) * w[c2] * (1 - c5)
    return d * (w.abs() > 1e-8).to(t.dtype)


PROJECTIONS = {Norm.LINF: projection_linf, Norm.L2: projection_l2}
ORDERS = {Norm.LINF: math.inf, Norm.L2: 2.0}


class _FABTargeted(Attack):
    family = AttackFamily.GRADIENT
    requires = Capability.GRADIENTS
    chunk_independent = True
    Config = FABConfig
    targeted = True
    skips_misclassified = True  # a sample already misclassified needs no boundary search

    def size(self, delta: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(delta.flatten(1), ord=ORDERS[self.norm], dim=1)

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_finite_budget(self.name, eps)
        cfg = self.config
        if call.target is None:
            targets = ranked_targets(call.clean_logits, y, cfg.n_target_classes)
        else:
            targets = call.target[:, None]
        x_out = x.clone()
        best = torch.full((len(x),), math.inf, device=x.device)
        steps = torch.zeros(len(x), dtype=torch.long, device=x.device)
        for rank in counted("target", targets.shape[1]):
            for restart in counted("restart", cfg.n_restarts):
                todo = (best > eps).nonzero().squeeze(1)
                if not len(todo):
                    break
                found, size, moves = self._run(
                    predictor, x[todo], y[todo], targets[todo, rank], eps, call.streams[todo],
                    random_start=restart > 0,
                )  # fmt: skip
                steps[todo] += moves
                smaller = size < best[todo]
                x_out[todo[smaller]] = found[smaller]
                best[todo[smaller]] = size[smaller]
        return x_out, steps

    def _run(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        target: torch.Tensor,
        eps: float,
        streams: SampleStreams,
        random_start: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One run towards ``target``: the smallest misclassified points, their sizes (inf
        where none was found) and the steps per sample."""
        cfg = self.config
        n = len(x)
        x1 = x.clone()
        if random_start:
            if self.norm is Norm.LINF:
                noise = 2 * streams.rand(x.shape) - 1
                direction = normalized(noise, math.inf)
            else:
                direction = normalized(streams.randn(x.shape), 2)
            x1 = (x + eps * direction * 0.5).clamp(0, 1)
        found = x.clone()
        size = torch.full((n,), math.inf, device=x.device)
        moves = torch.zeros(n, dtype=torch.long, device=x.device)
        project = PROJECTIONS[self.norm]
        idx = torch.arange(n, device=x.device)
        for _ in counted("iteration", cfg.steps):
            if not len(idx):
                break
            xi, x0, m = x1[idx], x[idx], len(idx)
            grad, _, f = loss_gradient(predictor, xi, y[idx], target_margin, target[idx])
            w = grad.flatten(1)
            b = -f + (w * xi.flatten(1)).sum(1)
            d = project(torch.cat((xi.flatten(1), x0.flatten(1))), torch.cat((w, w)),
                        torch.cat((b, b)))  # fmt: skip
            lengths = self.size(d).clamp_min(1e-8)
            a1, a2 = lengths[:m], lengths[m:]
            alpha = per_sample((a1 / (a1 + a2)).clamp(0, cfg.alpha_max), xi)
            d1, d2 = d[:m].view_as(xi), d[m:].view_as(xi)
            x_new = ((xi + cfg.eta * d1) * (1 - alpha) + (x0 + cfg.eta * d2) * alpha).clamp(0, 1)
            with torch.no_grad():
                wrong = predictor.watched_logits(x_new).argmax(1) != y[idx]
            moves[idx] += 1
            current = self.size(x_new - x0)
            smaller = wrong & (current < size[idx])
            found[idx[smaller]] = x_new[smaller]
            size[idx[smaller]] = current[smaller]
            x_new[wrong] = x0[wrong] + (x_new[wrong] - x0[wrong]) * cfg.beta
            x1[idx] = x_new
            if cfg.early_stop:
                idx = idx[size[idx] > eps]
        return found, size, moves


class FABT(_FABTargeted):
    name = "fab-t"
    norm = Norm.LINF
    description = "Targeted FAB, l-inf, minimal boundary-crossing steps (Croce & Hein 2020)"


class FABTL2(_FABTargeted):
    name = "fab-t-l2"
    norm = Norm.L2
    description = "Targeted FAB, l2, minimal boundary-crossing steps (Croce & Hein 2020)"
