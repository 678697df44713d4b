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
from functools import lru_cache

import numpy as np
import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.score_search import ScoreSearch
from aisafety.attack.square_draws import DeviceDraws
from aisafety.attack.streams import SampleStreams, scaled
from aisafety.attack.work import counted
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

# Where redraws are decided (the same numbers everywhere; tests compare them): "device" (every
# candidate gathered on the device, square_draws.py: no synchronisation, the default on a
# GPU), "host" (reading ahead in each sample's stream, one copy of the flags a query: the
# default on the CPU) or "loop" (the reference's one-by-one loop)
REDRAWS: str | None = None

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


@lru_cache(maxsize=64)
def _window_parts(
    c: int, h: int, w: int, side: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """What ``_flat_window`` needs for windows of ``side`` in (c, h, w) images: the corners'
    ranges, their largest values, the strides and each window element's offset."""
    rows, cols = max(h - side, 1), max(w - side, 1)
    span = torch.arange(side)
    offsets = torch.arange(c)[:, None, None] * (h * w) + span[:, None] * w + span
    parts = (torch.tensor([rows, cols], dtype=torch.float32), torch.tensor([rows - 1, cols - 1]),
             torch.tensor([w, 1]), offsets.flatten())  # fmt: skip
    return tuple(part.to(device) for part in parts)


def _flat_window(corner: torch.Tensor, c: int, h: int, w: int, side: int) -> torch.Tensor:
    """Each sample's window from its two corner uniforms, as flat indices into its image
    (m, c * side * side): the corners of ``SquareLinf._window``, the same integers."""
    ranges, largest, strides, offsets = _window_parts(c, h, w, side, corner.device)
    top_left = torch.minimum((corner * ranges).long(), largest)
    return (top_left * strides).sum(1, keepdim=True) + offsets


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

    def _draws_on_device(self, device: torch.device, channels: int) -> bool:
        """Whether this call's redraws are decided on the device (``DeviceDraws``)."""
        where = REDRAWS or ("device" if device.type == "cuda" else "host")
        return where == "device" and DeviceDraws.serves(
            2 + channels, channels, self.config.max_resamples - 1
        )

    def image_memory(self, predictor: Predictor) -> int:
        """The passes' memory, and on the device the ring of draws each sample keeps there
        and its two signed images (``x + eps`` and ``x - eps``, float32)."""
        c = predictor.input_shape[0]
        extra = 0
        if self._draws_on_device(predictor.device, c):
            extra = DeviceDraws.sample_bytes(2 + c, c, self.config.max_resamples - 1)
            extra += 2 * math.prod(predictor.input_shape) * 4
        return super().image_memory(predictor) + extra

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        n, c, h, w = x.shape
        with torch.inference_mode():
            stripes = call.streams.signs((n, c, 1, w)) * eps
            start = (x + stripes).clamp(0, 1)
            side_max = max(min(h, w) - 1, 1)
            steps = torch.tensor([eps, -eps], device=x.device).view(2, 1, 1, 1, 1)
            draws = None
            if self._draws_on_device(x.device, c):
                draws = DeviceDraws(call.streams, 2 + c, c, cfg.max_resamples - 1, x.device)
                # windows are flat indices into contiguous images; both signs' images are
                # made once (a query gathers its windows from them)
                start = start.contiguous()
                x_signed = (x.reshape(n, -1) + steps.view(2, 1, 1)).clamp(0, 1)
            search = ScoreSearch(predictor, y, start)
            redraws = REDRAWS or ("device" if x.device.type == "cuda" else "host")
            redraws = "host" if redraws == "device" and draws is None else redraws
            for iteration in counted("query", cfg.queries - 1):
                rows, active = search.active()
                if not len(rows):
                    break
                p = p_selection(cfg.p_init, iteration, cfg.queries)
                side = min(max(round(math.sqrt(p * h * w)), 1), side_max)
                current = search.best[active]
                if draws is not None:
                    draws.prepare(rows)
                    proposal, flat, window, before = self._propose_on_device(
                        x_signed, current, side, draws, active
                    )
                    margin = search.query(proposal, active)
                    search.update_windows(rows, active, flat, window, before, margin)
                    continue
                streams = call.streams[rows]
                proposal = self._propose(x[active], current, side, steps, streams, redraws)
                search.update(rows, active, proposal, current, search.query(proposal, active))
        return search.finish()

    def _propose_on_device(
        self,
        x_signed: torch.Tensor,
        current: torch.Tensor,
        side: int,
        draws: DeviceDraws,
        rows: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """``_propose``'s proposal, from every candidate sign drawn at once on the device: the
        first that changes the window is taken (the last one if none does), and each
        sample's stream moves past the draws used. Nothing is asked of the device, and
        every step works on the windows (few launches a query: docs/gpu.md).

        ``current`` (the rows' best points, a copy) becomes the proposal in place; returned
        with the windows' flat indices, new values and values before, for
        ``ScoreSearch.update_windows``."""
        m, c, h, w = current.shape
        u = draws.draw(rows)  # corner, signs, then every redraw's signs
        flat = _flat_window(u[:, :2], c, h, w, side)  # (m, c * side * side)
        before = current.view(m, -1).gather(1, flat)
        # each sign's window (2, m, c, side * side) from the images ``x + eps``, ``x - eps``
        # clamped into [0, 1] (``x_signed``, (2, n, c * h * w)), the bits of ``_propose``'s
        signed = x_signed[:, rows[:, None], flat].view(2, m, c, -1)
        # how far each sign moves each channel's window (2, m, c), then each candidate's
        # window (m, 1 + redraws): unchanged below 1e-7, as in ``_propose``
        change = (signed - before.view(m, c, -1)).abs().amax(3)
        positive = u[:, 2:].view(m, -1, c) < 0.5  # (m, 1 + redraws, c)
        moved = torch.where(positive, change[0][:, None], change[1][:, None]).amax(2)
        # the first candidate that changes the window, the last one if none does: every
        # change >= 1e-7 clamps to the same float32 value, the largest; argmax takes the
        # first largest (the leading unchanged candidates are the redraws)
        moved[:, -1].fill_(torch.inf)
        used = moved.clamp_max_(1e-7).argmax(1)
        draws.advance(rows, used)
        chosen = positive.gather(1, used.view(m, 1, 1).expand(m, 1, c)).view(m, c, 1)
        window = torch.where(chosen, signed[0], signed[1]).view(m, -1)
        current.view(m, -1).scatter_(1, flat, window)
        return current, flat, window, before

    def _propose(
        self,
        x: torch.Tensor,
        best: torch.Tensor,
        side: int,
        steps: torch.Tensor,
        streams: SampleStreams,
        redraws: str,
    ) -> torch.Tensor:
        """Each sample's best point with one random window set to a fresh sign per channel.

        As in the reference, a window whose new signs leave the image unchanged (it already
        had them, or clipping undoes them) is redrawn, for all such samples at once (only
        they draw again: a sample's draws do not depend on its neighbours). The work is on
        the windows (side x side patches gathered per sample), not on whole images: both
        signs' windows are made once, so a redraw costs a draw and a lookup, on the host.
        """
        m, c, h, w = x.shape
        on_host = redraws == "host"
        # one draw per iteration: the corner and the signs
        if on_host:
            u = streams.uniforms_on_host(2 + c)
            where = self._window_from_host(u[:, :2], c, h, w, side, x.device)
        else:
            u = streams.rand((m, 2 + c))
            where = self._window(u[:, :2], m, c, h, w, side)
        x_window, best_window = x[where], best[where]  # (m, c, side, side)
        signed = (x_window + steps).clamp(0, 1)  # (2, m, c, side, side): +eps, -eps
        # (2, m, c): whether sign +eps (0) or -eps (1) leaves the channel's window as it is
        same = ((signed - best_window).abs() < 1e-7).flatten(3).all(3)
        if on_host:
            positive = u[:, 2:] < 0.5  # (m, c): the sign of each channel
            self._redraw_on_host(positive, same.cpu().numpy(), streams)
            chosen = torch.from_numpy(positive).to(x.device)
        else:
            chosen = u[:, 2:] < 0.5
            keeps = {True: same[0], False: same[1]}
            redraw = self._unchanged(chosen, keeps).nonzero().squeeze(1)
            self._redraw_one_by_one(chosen, keeps, redraw, streams)
        proposal = best.clone()
        proposal[where] = torch.where(chosen[:, :, None, None], signed[0], signed[1])
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

    @staticmethod
    def _window_from_host(
        corner: np.ndarray, c: int, h: int, w: int, side: int, device: torch.device
    ) -> tuple[torch.Tensor, ...]:
        """``_window``'s index, worked out on the host and sent in one copy (the same
        integers: float32 products truncated as ``scaled`` does)."""
        m = len(corner)
        rows, cols = max(h - side, 1), max(w - side, 1)
        top = np.minimum((corner[:, 0] * np.float32(rows)).astype(np.int64), rows - 1)
        left = np.minimum((corner[:, 1] * np.float32(cols)).astype(np.int64), cols - 1)
        span = np.arange(side)
        packed = np.concatenate(
            [
                np.arange(m),
                np.arange(c),
                (top[:, None] + span).ravel(),
                (left[:, None] + span).ravel(),
            ]
        )
        index = torch.from_numpy(packed).to(device)
        at_rows = index[m + c : m + c + m * side].view(m, side)
        at_cols = index[m + c + m * side :].view(m, side)
        return (
            index[:m].view(m, 1, 1, 1),
            index[m : m + c].view(1, c, 1, 1),
            at_rows.view(m, 1, side, 1),
            at_cols.view(m, 1, 1, side),
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

    def _redraw_on_host(
        self, positive: np.ndarray, same: np.ndarray, streams: SampleStreams
    ) -> None:
        """``_redraw_one_by_one``'s result, bit for bit, decided on the host from the
        windows' flags ``same`` (2, m, c) in one copy: each sample's next draws are read
        ahead in its stream's buffer (``peek_uniforms``), the first that changes its window
        is taken and only the draws used are counted as drawn. A sample at its buffer's end
        draws one by one (that draw refills it, as before). On a GPU the device is asked
        nothing per redraw (docs/gpu.md)."""
        c = positive.shape[1]

        def unchanged(signs: np.ndarray, rows: np.ndarray) -> np.ndarray:
            return np.where(signs, same[0][rows], same[1][rows]).all(-1)

        rows = np.flatnonzero(unchanged(positive, slice(None)))
        budget = np.full(len(rows), self.config.max_resamples - 1, dtype=np.int64)
        while len(rows) and budget.max() > 0:
            view = streams[rows]
            ahead = np.minimum(view.available_uniforms(c), budget)
            if ahead.max() == 0:  # every sample left is at its buffer's end
                drawn = view.uniforms_on_host(c) < 0.5
                positive[rows] = drawn
                used, done = np.ones_like(budget), ~unchanged(drawn, rows)
            else:
                candidates = view.peek_uniforms(c, int(ahead.max())) < 0.5  # (r, ahead, c)
                valid = np.arange(candidates.shape[1])[None, :] < ahead[:, None]
                changes = ~unchanged(candidates, rows[:, None]) & valid
                done = changes.any(1)
                # a sample ends on its first change, or on its last valid draw (one by one)
                used = np.where(done, changes.argmax(1) + 1, ahead)
                taken = candidates[np.arange(len(rows)), np.maximum(used - 1, 0)]
                moved = used > 0
                positive[rows[moved]] = taken[moved]
                view.consume_uniforms(c, used)
            budget -= used
            keep = ~done & (budget > 0)
            rows, budget = rows[keep], budget[keep]

    @staticmethod
    def _unchanged(positive: torch.Tensor, keeps: dict[bool, torch.Tensor]) -> torch.Tensor:
        """Per sample, whether every channel's sign leaves its window unchanged."""
        return torch.where(positive, keeps[True], keeps[False]).all(1)
