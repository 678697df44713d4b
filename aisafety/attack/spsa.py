"""SPSA under the l-inf norm (Uesato et al., ICML 2018), score-based.

"Adversarial Risk and the Dangers of Evaluating Against Weak Attacks" (arXiv:1802.05666),
Algorithm 1: the gradient of the margin loss ``logit[y] - max_{j != y} logit[j]`` is estimated
from scores only, by simultaneous perturbation stochastic approximation (Spall 1992):

    g = 1/S * sum_s (L(x + delta v_s) - L(x - delta v_s)) / (2 delta) * v_s,

with ``v_s`` Rademacher vectors (+-1 per pixel; ``1 / v = v``). The perturbation is updated by
Adam (lr 0.01) on that estimate and projected back into the l-inf ball and the [0, 1] box after
every step. The paper's settings are the defaults: delta 0.01, S = 128 perturbation pairs per
step (its "batch size"), Adam lr 0.01; the number of steps is ours (100; the paper runs
longer on ImageNet). As in the paper, a sample stops as soon as it is misclassified.

Batched over samples: every sample has its own Rademacher vectors, its own Adam moments and
stops on its own; the S pairs are evaluated ``nb_samples_per_step`` at a time, so one forward
pass holds ``2 * nb_samples_per_step * (active samples)`` images. The points ``x +- delta v``
are clipped into [0, 1] before they are queried (a predictor takes only [0, 1] inputs); at a
pixel on the box's edge the difference is then one-sided, with the same sign.

``steps`` counts the model queries spent per sample on perturbed inputs: ``2 * samples``
for the gradient estimate plus one for the new iterate, per Adam step. Samples the model
already misclassifies (by the call's clean logits) are left as they are with 0 queries
(``Attack.skips_misclassified``). The attack returns, per sample, the iterate with the lowest
margin it queried.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.score_search import margin_loss
from aisafety.attack.streams import SampleStreams
from aisafety.attack.threat import LinfThreat
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class SPSAConfig(AttackConfig):
    steps: int = Field(default=100, gt=0, description="Adam steps (iterations) per sample")
    samples: int = Field(
        default=128,
        gt=0,
        description="Rademacher perturbation pairs per gradient estimate (2 queries each)",
    )
    nb_samples_per_step: int = Field(
        default=16,
        gt=0,
        description="perturbation pairs evaluated in one forward pass (memory vs speed); "
        "does not change the result",
    )
    delta: float = Field(default=0.01, gt=0, description="finite-difference perturbation size")
    lr: float = Field(default=0.01, gt=0, description="Adam learning rate")
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_eps: float = Field(default=1e-8, gt=0)
    early_stop: bool = Field(
        default=True, description="stop a sample once it is misclassified (the paper's rule)"
    )


class SPSA(Attack):
    name = "spsa"
    family = AttackFamily.SCORE
    norm = Norm.LINF
    requires = Capability.SCORES
    chunk_independent = True
    description = "SPSA gradient estimate + Adam, l-inf, score-based (Uesato et al. 2018)"
    Config = SPSAConfig
    skips_misclassified = True

    def passes_per_image(self) -> tuple[int, int]:
        return 0, 2 * self.config.nb_samples_per_step  # the pairs of one forward pass

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        with torch.inference_mode():
            x0, y0 = x, y
            m = len(x)
            delta = torch.zeros_like(x0)  # the perturbation Adam optimises
            moment1 = torch.zeros_like(x0)
            moment2 = torch.zeros_like(x0)
            best = x0.clone()
            best_margin = margin_loss(call.clean_logits, y0)
            used = torch.zeros(m, dtype=torch.long, device=x.device)
            active = torch.arange(m, device=x.device)
            per_step = 2 * cfg.samples + 1
            for t in range(1, cfg.steps + 1):
                point = x0[active] + delta[active]
                grad = self._estimate(predictor, point, y0[active], call.streams[active])
                m1 = cfg.beta1 * moment1[active] + (1 - cfg.beta1) * grad
                m2 = cfg.beta2 * moment2[active] + (1 - cfg.beta2) * grad.square()
                moment1[active], moment2[active] = m1, m2
                step = (m1 / (1 - cfg.beta1**t)) / ((m2 / (1 - cfg.beta2**t)).sqrt() + cfg.adam_eps)
                # descend the margin, then project into the ball and the box
                x_new = LinfThreat.contain_delta(delta[active] - cfg.lr * step, x0[active], eps)
                delta[active] = x_new - x0[active]
                logits = predictor.logits(x_new)
                used[active] += per_step
                margin = margin_loss(logits, y0[active])
                better = margin < best_margin[active]
                best_margin[active] = torch.where(better, margin, best_margin[active])
                best[active] = torch.where(better[:, None, None, None], x_new, best[active])
                if cfg.early_stop:
                    active = active[logits.argmax(1) == y0[active]]
                    if not len(active):
                        break
        return best, used

    def _estimate(
        self, predictor: Predictor, point: torch.Tensor, y: torch.Tensor, streams: SampleStreams
    ) -> torch.Tensor:
        """The SPSA estimate of the margin's gradient at ``point``, one per sample."""
        cfg = self.config
        m = len(point)
        grad = torch.zeros_like(point)
        labels = y.repeat(2 * min(cfg.nb_samples_per_step, cfg.samples))
        done = 0
        while done < cfg.samples:
            k = min(cfg.nb_samples_per_step, cfg.samples - done)
            shape = (k, *point.shape)
            # Rademacher +-1, (k, m, C, H, W), each sample's from its own stream
            v = streams.signs((m, k, *point.shape[1:]), point.dtype).transpose(0, 1)
            batch = torch.empty((2, *shape), dtype=point.dtype, device=point.device)
            torch.add(point, v, alpha=cfg.delta, out=batch[0])
            torch.sub(point, v, alpha=cfg.delta, out=batch[1])
            batch.clamp_(0, 1)
            logits = predictor.logits(batch.view(-1, *point.shape[1:]))  # (2k * m, C, H, W)
            losses = margin_loss(logits, labels[: 2 * k * m]).view(2, k, m)
            diff = (losses[0] - losses[1]) / (2 * cfg.delta)  # (k, m)
            grad += torch.einsum("km,kmd->md", diff, v.flatten(2)).view_as(point)
            done += k
        return grad / cfg.samples
