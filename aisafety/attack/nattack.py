"""NATTACK under the l-inf norm (Li et al., ICML 2019), score-based.

"NATTACK: Learning the Distributions of Adversarial Examples for an Improved Black-Box Attack
on Deep Neural Networks" (arXiv:1905.00441). Instead of one adversarial example, the attack
learns a Gaussian search distribution ``N(mu, sigma^2 I)`` over an offset in tanh space: a
draw ``z = arctanh(2x - 1) + mu + sigma * eps_i`` maps to the image ``(tanh(z) + 1) / 2``,
which is projected into the l-inf ball around ``x``. The mean ``mu`` follows the natural
evolution strategies (NES) estimate of the gradient of the expected loss,

    mu <- mu + lr / (population * sigma) * sum_i A_i eps_i,

with ``A_i`` the population's rewards ``-0.5 * max(0, logit[y] - max_{j != y} logit[j])``
standardised to zero mean and unit (population) deviation, following the authors' reference
implementation (github.com/Cold-Winter/Nattack): ``mu`` initialised with N(0, 0.001^2) noise,
``arctanh`` taken of ``(2x - 1) * (1 - 1e-6)``, the reward its ``log p_y - log max_{j != y}
p_j`` written with logits (the softmax's normaliser cancels). Defaults are the paper's
population 300, sigma 0.1 and lr 0.02, with at most 300 iterations.

The reference tests the mean's image ``proj((tanh(arctanh(2x-1) + mu) + 1) / 2)`` every 10
iterations and stops a sample once it is misclassified; here the mean is tested every
iteration (one query next to the population's 300), and a population member that is already
misclassified inside the budget is also kept as the sample's result: the model answered that
query anyway. Batched over samples; each sample has its own ``mu`` and its own draws; the
populations of as many samples as fit in ``max_batch`` images (at least one sample's) are
drawn and evaluated together, which bounds the memory.

Note that tanh space saturates: a pixel at exactly 0 or 1 sits at ``arctanh(+-(1 - 1e-6))
~ +-7.25`` where ``sigma = 0.1`` moves it by ~1e-6, so on images with many saturated pixels
(82% of MNIST's) only the intermediate pixels move and the attack is weak. ``box_shrink``
(default the reference's 1e-6) sets that margin: with 0.3 a saturated pixel's draws centre
on 0.15 or 0.85 (before the projection into the eps ball), where tanh is steep enough for
the search to move them. On the zoo's MNIST CNN (32 test images, eps 0.3, 10 iterations of
30 draws, lr 0.1) the robust accuracy is 0.84 with 1e-6, 0.25 with 0.1 and 0.06 with 0.3.

``steps`` counts the model queries spent per sample on perturbed inputs (``population + 1``
per iteration); samples the model already misclassifies (by the call's clean logits) are left
as they are with 0 queries (``Attack.skips_misclassified``).
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


class NAttackConfig(AttackConfig):
    iterations: int = Field(default=300, gt=0, description="maximum NES updates per sample")
    population: int = Field(default=300, gt=1, description="draws per NES update")
    sigma: float = Field(default=0.1, gt=0, description="search distribution's deviation")
    lr: float = Field(default=0.02, gt=0, description="NES learning rate of the mean")
    init_std: float = Field(default=0.001, ge=0, description="deviation of the initial mean")
    box_shrink: float = Field(
        default=1e-6,
        gt=0,
        lt=1,
        description="arctanh is taken of (2x - 1) * (1 - box_shrink) (the reference: 1e-6); "
        "larger values let pixels at exactly 0 or 1 move (see the module docstring)",
    )
    max_batch: int = Field(
        default=4096,
        gt=0,
        description="images drawn and evaluated at once (memory vs speed); at least one "
        "sample's population",
    )


class NAttack(Attack):
    name = "nattack"
    family = AttackFamily.SCORE
    norm = Norm.LINF
    requires = Capability.SCORES
    chunk_independent = True
    description = "NATTACK, Gaussian search distribution learnt by NES, l-inf (Li et al. 2019)"
    Config = NAttackConfig
    skips_misclassified = True

    def passes_per_image(self) -> tuple[int, int]:
        return 0, self.config.population  # one sample's draws are evaluated together

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        with torch.inference_mode():
            x0, y0 = x, y
            m = len(x)
            z0 = torch.atanh((2 * x0 - 1) * (1 - cfg.box_shrink))
            mu = cfg.init_std * call.streams.randn(x0.shape)
            found = x0.clone()
            used = torch.zeros(m, dtype=torch.long, device=x.device)
            active = torch.arange(m, device=x.device)
            pop = cfg.population
            for _ in range(cfg.iterations):
                xa, ya, za, mua = x0[active], y0[active], z0[active], mu[active]
                # the mean's image first: a fooled sample stops here
                mean_img = self._image(za + mua, xa, eps)
                fooled = self._logits(predictor, mean_img).argmax(1) != ya
                used[active] += 1
                found[active[fooled]] = mean_img[fooled]
                keep = ~fooled
                active, xa, ya, za, mua = active[keep], xa[keep], ya[keep], za[keep], mua[keep]
                k = len(active)
                if not k:
                    break
                # the population, in blocks of samples whose draws fit in ``max_batch`` images
                block = max(1, cfg.max_batch // pop)
                hit = torch.zeros(k, dtype=torch.bool, device=x.device)
                for lo in range(0, k, block):
                    part = slice(lo, lo + block)
                    new_mu, hit[part], adv_img = self._update(
                        predictor,
                        xa[part],
                        ya[part],
                        za[part],
                        mua[part],
                        eps,
                        call.streams[active[part]],
                    )
                    rows = active[part]
                    mu[rows] = new_mu
                    found[rows[hit[part]]] = adv_img
                used[active] += pop
                active = active[~hit]
                if not len(active):
                    break
            # samples never fooled end at their mean's image
            if len(active):
                found[active] = self._image(z0[active] + mu[active], x0[active], eps)
        return found, used

    def _update(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        z: torch.Tensor,
        mu: torch.Tensor,
        eps: float,
        streams: SampleStreams,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One NES update of the means ``mu`` of a block of samples.

        Returns the new means, which samples had a misclassified draw and (for those) the
        first such draw's image.
        """
        cfg = self.config
        k, pop = len(x), cfg.population
        noise = streams.randn((k, pop, *x.shape[1:]))
        images = self._image(z[:, None] + mu[:, None] + cfg.sigma * noise, x[:, None], eps)
        logits = self._logits(predictor, images.flatten(0, 1))
        margin = margin_loss(logits, y.repeat_interleave(pop)).view(k, pop)
        reward = -0.5 * margin.clamp(0, 1000)
        std = reward.std(1, unbiased=False, keepdim=True)
        advantage = (reward - reward.mean(1, keepdim=True)) / (std + 1e-7)
        step = torch.einsum("kp,kpd->kd", advantage, noise.flatten(2)).view_as(mu)
        adv = margin < 0
        hit = adv.any(1)
        first = adv.to(torch.uint8).argmax(1)
        rows = torch.nonzero(hit).squeeze(1)
        return mu + cfg.lr / (pop * cfg.sigma) * step, hit, images[rows, first[rows]]

    @staticmethod
    def _image(z: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        """``(tanh(z) + 1) / 2`` projected into the l-inf ball of ``eps`` around ``x``."""
        img = (torch.tanh(z) + 1) / 2
        return LinfThreat.contain_delta(img - x, x, eps)

    def _logits(self, predictor: Predictor, batch: torch.Tensor) -> torch.Tensor:
        return torch.cat([predictor.logits(part) for part in batch.split(self.config.max_batch)])
