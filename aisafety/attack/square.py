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

import numpy as np
import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.score_search import ScoreSearch
from aisafety.attack.streams import SampleStreams, scaled
from aisafety.attack.work import counted
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

# (upper end of the iteration range in 1/10000 of the budget, divisor of p_init)
# Redraws read ahead in each sample's stream (the same numbers as one by one; tests compare):
# on a GPU, where each round of the loop costs synchronisations; None: on any device but the CPU
BATCHED_REDRAWS: bool | None = None
# Draws read ahead per row in the first round of redraws (over every row; later rounds, over
# the rows still unchanged, read as far as each may go)
LOOKAHEAD = 16

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
            stripes = call.streams.signs((n, c, 1, w)) * eps
            search = ScoreSearch(predictor, y, (x + stripes).clamp(0, 1))
            side_max = max(min(h, w) - 1, 1)
            for iteration in counted("query", cfg.queries - 1):
                rows, active = search.active()
                if not len(rows):
                    break
                p = p_selection(cfg.p_init, iteration, cfg.queries)
                side = min(max(round(math.sqrt(p * h * w)), 1), side_max)
                current = search.best[active]
                proposal = self._propose(x[active], current, side, eps, call.streams[rows])
                search.update(rows, active, proposal, current, search.query(proposal, active))
        return search.finish()

    def _propose(
        self, x: torch.Tensor, best: torch.Tensor, side: int, eps: float, streams: SampleStreams
    ) -> torch.Tensor:
        """Each sample's best point with one random window set to a fresh sign per channel.

        As in the reference, a window whose new signs leave the image unchanged (it already
        had them, or clipping undoes them) is redrawn, for all such samples at once (only
        they draw again: a sample's draws do not depend on its neighbours). The work is on
        the windows (side x side patches gathered per sample), not on whole images: both
        signs' windows are made once, so a redraw costs a draw and a lookup.
        """
        m, c, h, w = x.shape
        u = streams.rand((m, 2 + c))  # one draw per iteration: the corner and the signs
        where = self._window(u[:, :2], m, c, h, w, side)
        x_window, best_window = x[where], best[where]  # (m, c, side, side)
        steps = torch.tensor([eps, -eps], device=x.device).view(2, 1, 1, 1, 1)
        signed = (x_window + steps).clamp(0, 1)  # (2, m, c, side, side): +eps, -eps
        same = ((signed - best_window).abs() < 1e-7).flatten(3).all(3)  # (2, m, c)
        keeps = {True: same[0], False: same[1]}  # by sign > 0: the window stays as it is
        positive = u[:, 2:] < 0.5  # (m, c): the sign of each channel
        batched = BATCHED_REDRAWS if BATCHED_REDRAWS is not None else x.device.type != "cpu"
        if batched:
            self._redraw_ahead(positive, keeps, streams)
        else:
            redraw = self._unchanged(positive, keeps).nonzero().squeeze(1)
            self._redraw_one_by_one(positive, keeps, redraw, streams)
        proposal = best.clone()
        proposal[where] = torch.where(positive[:, :, None, None], signed[0], signed[1])
        return proposal

    @staticmethod
    def _window(
        corner: torch.Tensor, m: int, c: int, h: int, w: int, side: int
    ) -> tuple[torch.Tensor, ...]:
        """The advanced index of each sample's window from its two corner uniforms."""
        rows, cols = max(h - side, 1), max(w - side, 1)
        if rows == cols:  # square images: one scaling for both corners
            top, left = scaled(corner, rows).unbind(1)
        else:
            top, left = scaled(corner[:, 0], rows), scaled(corner[:, 1], cols)
        span = torch.arange(side, device=corner.device)
        return (
            torch.arange(m, device=corner.device)[:, None, None, None],
            torch.arange(c, device=corner.device)[None, :, None, None],
            (top[:, None] + span)[:, None, :, None],
            (left[:, None] + span)[:, None, None, :],
        )

    def _redraw_one_by_one(
        self,
        positive: torch.Tensor,
        keeps: dict[bool, torch.Tensor],
        redraw: torch.Tensor,
        streams: SampleStreams,
    ) -> None:
        """The reference's loop: every sample in ``redraw`` draws new signs until they change
        its window, at most ``max_resamples - 1`` times (a few synchronisations a round)."""
        c = positive.shape[1]
        for _ in range(self.config.max_resamples - 1):
            if not len(redraw):
                break
            drawn = streams[redraw].signs((len(redraw), c)) > 0
            positive[redraw] = drawn
            part = {sign: flags[redraw] for sign, flags in keeps.items()}
            redraw = redraw[self._unchanged(drawn, part)]

    def _redraw_ahead(
        self, positive: torch.Tensor, keeps: dict[bool, torch.Tensor], streams: SampleStreams
    ) -> None:
        """``_redraw_one_by_one``'s result, bit for bit, in one round for most queries: each
        sample's next draws are read ahead from its stream's buffer (``peek_uniforms``), the
        first that changes the window is taken and only the draws used are counted as drawn.
        The first round covers every row (those that need no redraw use none), so which rows
        redraw is never asked of the device; the host learns the draws used in one copy. A
        sample at its buffer's end draws one by one (that draw refills it, as before). On a
        GPU each round is a device synchronisation (docs/gpu.md)."""
        m, c = positive.shape
        budget = np.full(m, self.config.max_resamples - 1, dtype=np.int64)
        redraw: torch.Tensor | None = None  # every row, masked by ``need``
        need: torch.Tensor | None = self._unchanged(positive, keeps)
        rows = streams
        while budget.size and budget.max() > 0:
            part = keeps if redraw is None else {s: f[redraw] for s, f in keeps.items()}
            ahead = np.minimum(rows.available_uniforms(c), budget)
            if redraw is None:  # the first round: every row, most need few draws
                ahead = np.minimum(ahead, LOOKAHEAD)
            if ahead.max() == 0:  # every sample left is at its buffer's end
                if redraw is None:
                    redraw = self._unchanged(positive, keeps).nonzero().squeeze(1)
                    keep = np.zeros(m, dtype=bool)
                    keep[redraw.cpu().numpy()] = True
                    rows, budget, need = streams[redraw], budget[keep], None
                    continue
                drawn = rows.signs((len(redraw), c)) > 0
                positive[redraw] = drawn
                used, done = np.ones_like(budget), ~self._unchanged(drawn, part).cpu().numpy()
            else:
                used, done = self._take_first_change(positive, part, redraw, rows, ahead, need)
            budget -= used
            keep = ~done & (budget > 0)
            kept = torch.from_numpy(np.flatnonzero(keep)).to(positive.device)
            redraw = kept if redraw is None else redraw[kept]
            rows, budget, need = streams[redraw], budget[keep], None

    def _take_first_change(
        self,
        positive: torch.Tensor,
        part: dict[bool, torch.Tensor],
        redraw: torch.Tensor | None,
        rows: SampleStreams,
        ahead: np.ndarray,
        need: torch.Tensor | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One read-ahead round over the rows ``redraw`` of ``positive`` (``None``: all of
        them, where only the rows in ``need`` redraw): per row, the draws used and whether its
        window changed (or needed no change)."""
        device, c = positive.device, positive.shape[1]
        n_ahead = torch.from_numpy(ahead).to(device)
        candidates = rows.peek_uniforms(c, int(ahead.max())) < 0.5  # (r, ahead, c)
        valid = torch.arange(candidates.shape[1], device=device)[None, :] < n_ahead[:, None]
        same = torch.where(candidates, part[True][:, None], part[False][:, None]).all(2)
        changes = ~same & valid
        found = changes.any(1)
        first = changes.to(torch.int8).argmax(1)
        # the sample ends on its first change, or on its last valid draw (as one by one)
        used = torch.where(found, first + 1, n_ahead)
        if need is not None:
            used, found = torch.where(need, used, 0), found | ~need
        taken = (used - 1).clamp_min(0)
        chosen = candidates[torch.arange(len(candidates), device=device), taken]
        moved = (used > 0)[:, None]
        if redraw is None:
            positive.copy_(torch.where(moved, chosen, positive))
        else:
            positive[redraw] = torch.where(moved, chosen, positive[redraw])
        host = torch.stack((used, found.long())).cpu().numpy()  # one copy, one synchronisation
        rows.consume_uniforms(c, host[0])
        return host[0], host[1].astype(bool)

    @staticmethod
    def _unchanged(positive: torch.Tensor, keeps: dict[bool, torch.Tensor]) -> torch.Tensor:
        """Per sample, whether every channel's sign leaves its window unchanged."""
        return torch.where(positive, keeps[True], keeps[False]).all(1)
