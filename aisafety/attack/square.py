"""Square Attack under the l-inf norm (Andriushchenko et al., ECCV 2020), score-based.

A random search that only reads the model's scores: it starts from vertical stripes of
+-eps, then repeatedly proposes to overwrite one random square window (the same sign per
channel over the window) and keeps the proposal when the margin loss
``logit[y] - max_{j != y} logit[j]`` goes down. The window's side follows the paper's
piecewise-constant schedule for the fraction ``p`` of pixels changed (halving from
``p_init`` at 10, 50, 200, 500, 1000, 2000, 4000, 6000 and 8000 of 10000 iterations,
rescaled to the query budget). This follows the authors' reference implementation
(github.com/max-andr/square-attack, ``square_attack_linf``), batched over samples: every
iteration is one model query for all samples still correctly classified; fooled samples
stop spending queries.

``steps`` counts the queries spent per sample on perturbed inputs, the initial stripes
included (the paper's count). Samples the model already misclassifies (by the call's clean
logits) are left as they are with 0 queries (``Attack.skips_misclassified``).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.streams import SampleStreams, scaled
from aisafety.attack.work import counted
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

# (upper end of the iteration range in 1/10000 of the budget, divisor of p_init)
_SCHEDULE = ((50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64), (6000, 128),
             (8000, 256), (10000, 512))  # fmt: skip


def p_selection(p_init: float, iteration: int, total: int) -> float:
    """The paper's schedule: fraction of pixels a window covers at ``iteration`` of ``total``."""
    it = int(iteration / total * 10000)
    if it <= 10:
        return p_init
    for bound, divisor in _SCHEDULE:
        if it <= bound:
            return p_init / divisor
    return p_init


def margin_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``logit[y] - max_{j != y} logit[j]``: positive while the sample is classified as y."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.clone()
    others.scatter_(1, y[:, None], float("-inf"))
    return true - others.amax(1)


class SquareConfig(AttackConfig):
    queries: int = Field(default=1000, gt=0, description="query budget per sample")
    p_init: float = Field(
        default=0.8, gt=0, le=1, description="initial fraction of pixels a window covers"
    )
    max_resamples: int = Field(
        default=100,
        gt=0,
        description="redraws of a window's signs that leave the image unchanged before "
        "the proposal is queried anyway",
    )


class SquareLinf(Attack):
    name = "square-linf"
    family = AttackFamily.SCORE
    norm = Norm.LINF
    requires = Capability.SCORES
    chunk_independent = True
    description = "Square Attack, l-inf, score-based random search (Andriushchenko et al. 2020)"
    Config = SquareConfig
    # bench/attacks.py, 512 MNIST images at eps 0.3 on 2 cores: 42.6 img/s whole, 34.7 in
    # chunks of 128 (four long tails of few-sample queries instead of one)
    cpu_chunk = 1024
    skips_misclassified = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        n, c, h, w = x.shape
        with torch.inference_mode():
            x0, y0 = x, y
            stripes = call.streams.signs((n, c, 1, w)) * eps
            best = (x0 + stripes).clamp(0, 1)
            margin = margin_loss(predictor.logits(best), y0)
            used = torch.ones(n, dtype=torch.long, device=x.device)
            side_max = max(min(h, w) - 1, 1)
            for iteration in counted("query", cfg.queries - 1):
                active = torch.nonzero(margin > 0).squeeze(1)
                if not len(active):
                    break
                p = p_selection(cfg.p_init, iteration, cfg.queries)
                side = min(max(round(math.sqrt(p * h * w)), 1), side_max)
                x_cur, best_cur = x0[active], best[active]
                proposal = self._propose(x_cur, best_cur, side, eps, call.streams[active])
                new_margin = margin_loss(predictor.logits(proposal, in_range=True), y0[active])
                improved = new_margin < margin[active]
                margin[active] = torch.where(improved, new_margin, margin[active])
                best[active] = torch.where(improved[:, None, None, None], proposal, best_cur)
                used[active] += 1
        return best, used

    def _propose(
        self, x: torch.Tensor, best: torch.Tensor, side: int, eps: float, streams: SampleStreams
    ) -> torch.Tensor:
        """Each sample's best point with one random window set to a fresh sign per channel.

        As in the reference, a window whose new signs leave the image unchanged (it already
        had them, or clipping undoes them) is redrawn, for all such samples at once (only
        they draw again: a sample's draws do not depend on its neighbours). The work is on
        the windows (side x side patches gathered per sample), not on whole images: whether
        a sign leaves a channel's window unchanged is worked out once per sign, so a redraw
        costs a draw and a lookup.
        """
        m, c, h, w = x.shape
        u = streams.rand((m, 2 + c))  # one draw per iteration: the corner and the signs
        top, left = scaled(u[:, 0], max(h - side, 1)), scaled(u[:, 1], max(w - side, 1))
        span = torch.arange(side, device=x.device)
        where = (
            torch.arange(m, device=x.device)[:, None, None, None],
            torch.arange(c, device=x.device)[None, :, None, None],
            (top[:, None] + span)[:, None, :, None],
            (left[:, None] + span)[:, None, None, :],
        )
        x_window, best_window = x[where], best[where]  # (m, c, side, side)

        def unchanged(sign: float) -> torch.Tensor:
            """(m, c): whether this sign leaves the channel's window as it is in ``best``."""
            same = ((x_window + sign).clamp(0, 1) - best_window).abs() < 1e-7
            return same.flatten(2).all(2)

        keeps = {True: unchanged(eps), False: unchanged(-eps)}  # by sign > 0
        positive = u[:, 2:] < 0.5  # (m, c): the sign of each channel
        redraw = self._unchanged(positive, keeps).nonzero().squeeze(1)
        for _ in range(self.config.max_resamples - 1):
            if not len(redraw):
                break
            drawn = streams[redraw].signs((len(redraw), c)) > 0
            positive[redraw] = drawn
            part = {sign: flags[redraw] for sign, flags in keeps.items()}
            redraw = redraw[self._unchanged(drawn, part)]
        signs = torch.where(positive, eps, -eps).view(m, c, 1, 1)
        proposal = best.clone()
        proposal[where] = (x_window + signs).clamp(0, 1)
        return proposal

    @staticmethod
    def _unchanged(positive: torch.Tensor, keeps: dict[bool, torch.Tensor]) -> torch.Tensor:
        """Per sample, whether every channel's sign leaves its window unchanged."""
        return torch.where(positive, keeps[True], keeps[False]).all(1)
