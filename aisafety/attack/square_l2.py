"""Square Attack under the l2 norm (Andriushchenko et al., ECCV 2020, Algorithm 3), score-based.

A random search that only reads the model's scores and keeps the perturbation on the l2
sphere of radius eps (up to the [0, 1] clip). It starts from a grid of s x s blocks,
s = min(h, w) // 5, centred in the image, each holding the paper's "pseudo-Gaussian" bump (two
halves of nested centred squares with weights 1 / (k + 1)^2, of opposite signs) with a random
sign per channel; the whole pattern is scaled to l2 norm eps. Each iteration then draws two
windows of side s (from the same p-schedule as l-inf; odd, at least 3, below min(h, w)) and,
per channel, moves all the mass the perturbation has in the union of the two windows, plus
any unused budget, into the first window: window 2 is zeroed and window 1 gets its old
content (normalised) plus a fresh bump of random sign, rescaled to that mass. The total is
renormalised to eps, clipped to [0, 1], and the proposal is kept when the margin loss
``logit[y] - max_{j != y} logit[j]`` goes down.

This follows the authors' reference implementation (github.com/max-andr/square-attack,
``square_attack_l2``), batched over samples: every iteration is one model query for all samples
still correctly classified; fooled samples stop spending queries. Unlike the reference (and its
ports in AutoAttack and torchattacks), which draw one pair of windows and one bump orientation
per iteration for the whole batch, every sample draws its own window positions and orientation.
With ``queries`` = n the reference runs n iterations after the initial query (n + 1 queries);
here the initial query counts, as in ``square-linf``.

``steps`` counts the queries spent per sample on perturbed inputs, the initial pattern included.
Samples the model already misclassifies (by the call's clean logits) are left as they are with
0 queries (``Attack.skips_misclassified``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.score_search import ScoreSearch
from aisafety.attack.square import p_selection
from aisafety.attack.streams import SampleStreams, scaled
from aisafety.attack.work import counted
from aisafety.errors import InputError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor

_TINY = 1e-12


def centred_squares(rows: int, cols: int) -> torch.Tensor:
    """Nested squares centred at (rows // 2, cols // 2), square k weighted 1 / (k + 1)^2,
    cropped to ``rows x cols`` and scaled to unit l2 norm (the reference's
    ``pseudo_gaussian_pert_rectangles``)."""
    delta = torch.zeros(rows, cols, dtype=torch.float64)
    top, left = rows // 2, cols // 2
    for k in range(max(top, left) + 1):
        delta[max(top - k, 0) : top + k + 1, max(left - k, 0) : left + k + 1] += 1.0 / (k + 1) ** 2
    return delta / delta.square().sum().sqrt()


@lru_cache(maxsize=64)
def _bump_cpu(side: int) -> torch.Tensor:
    bump = torch.zeros(side, side, dtype=torch.float64)
    bump[: side // 2] = centred_squares(side // 2, side)
    bump[side // 2 :] = -centred_squares(side - side // 2, side)
    return (bump / bump.square().sum().sqrt()).float()


def bump(side: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The paper's update pattern (``meta_pseudo_gaussian_pert``, untransposed): the top half
    of a ``side x side`` square holds positive centred squares, the bottom half negative ones;
    unit l2 norm."""
    return _bump_cpu(side).to(device)


def square_pair_update(
    delta: torch.Tensor,
    first: tuple[torch.Tensor, torch.Tensor],
    second: tuple[torch.Tensor, torch.Tensor],
    side: int,
    pattern: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """One proposal of Algorithm 3, before the final renormalisation to eps.

    ``delta`` (m, c, h, w) is the current perturbation, ``first`` and ``second`` the (top, left)
    corners, each of shape (m,), of the two ``side x side`` windows, ``pattern`` (m, c, side,
    side) the signed bump to add. Per sample and channel, the mass of delta in the union of
    the windows plus an equal share of the unused budget ``eps^2 - ||delta||^2`` ends up in
    window 1; window 2 (outside window 1) is zeroed; the rest of delta is kept. A perturbation
    of norm eps therefore keeps norm eps. Returns a new tensor.
    """
    m, c, h, w = delta.shape
    offsets = torch.arange(side, device=delta.device)
    samples = torch.arange(m, device=delta.device)[:, None, None, None]
    channels = torch.arange(c, device=delta.device)[None, :, None, None]

    def index(corner: tuple[torch.Tensor, torch.Tensor]):
        rows = (corner[0][:, None] + offsets)[:, None, :, None]
        cols = (corner[1][:, None] + offsets)[:, None, None, :]
        return samples, channels, rows, cols

    def mask(corner: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        rows = torch.arange(h, device=delta.device)[None, :] - corner[0][:, None]
        cols = torch.arange(w, device=delta.device)[None, :] - corner[1][:, None]
        in_rows, in_cols = (rows >= 0) & (rows < side), (cols >= 0) & (cols < side)
        return (in_rows[:, :, None] & in_cols[:, None, :])[:, None]  # (m, 1, h, w)

    window_1, window_2 = index(first), index(second)
    old = delta[window_1]  # (m, c, side, side)
    old_norm = old.square().sum((2, 3), keepdim=True).sqrt()
    image_norm_sq = delta.square().sum((1, 2, 3), keepdim=True)
    union = mask(first) | mask(second)
    union_norm_sq = (delta.square() * union).sum((2, 3), keepdim=True)
    new = pattern + old / (1e-10 + old_norm)
    new_norm = new.square().sum((2, 3), keepdim=True).sqrt()
    mass = ((eps**2 - image_norm_sq).clamp_min(0) / c + union_norm_sq).sqrt()
    new = new / (_TINY + new_norm) * mass
    updated = delta.clone()
    updated[window_2] = 0.0
    updated[window_1] = new
    return updated


def to_sphere(x: torch.Tensor, delta: torch.Tensor, eps: float) -> torch.Tensor:
    """``x + delta`` with delta scaled to l2 norm eps per sample, clipped to [0, 1]."""
    norms = delta.flatten(1).norm(dim=1).view(-1, *([1] * (delta.dim() - 1)))
    return (x + delta / (_TINY + norms) * eps).clamp(0, 1)


class SquareL2Config(AttackConfig):
    queries: int = Field(default=1000, gt=0, description="query budget per sample")
    p_init: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="initial fraction of pixels a window covers (the paper's l2 default)",
    )


class SquareL2(Attack):
    name = "square-l2"
    family = AttackFamily.SCORE
    norm = Norm.L2
    requires = Capability.SCORES
    chunk_independent = True
    description = "Square Attack, l2, score-based random search (Andriushchenko et al. 2020)"
    Config = SquareL2Config
    skips_misclassified = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not math.isfinite(eps):
            raise InputError(f"attack {self.name!r} needs a finite budget, got eps={eps}")
        cfg = self.config
        n, c, h, w = x.shape
        with torch.inference_mode():
            search = ScoreSearch(predictor, y, to_sphere(x, self._initial(x, call.streams), eps))
            side_max = max(min(h, w) - 1, 1)
            for iteration in counted("query", cfg.queries - 1):
                rows, active = search.active()
                if not len(rows):
                    break
                p = p_selection(cfg.p_init, iteration, cfg.queries)
                side = max(round(math.sqrt(p * h * w)), 3)
                side = min(side + 1 - side % 2, side_max)  # odd, as in the reference
                x_cur, best_cur = x[active], search.best[active]
                m = len(rows)
                # one draw per iteration: two (top, left) corners, orientation, signs
                u = call.streams[rows].rand((m, 5 + c))
                rows_range, cols_range = max(h - side, 1), max(w - side, 1)
                first = scaled(u[:, 0], rows_range), scaled(u[:, 1], cols_range)
                second = scaled(u[:, 2], rows_range), scaled(u[:, 3], cols_range)
                pattern = self._patterns(u[:, 4:], side)
                delta = square_pair_update(best_cur - x_cur, first, second, side, pattern, eps)
                proposal = to_sphere(x_cur, delta, eps)
                margin = search.query(proposal, active)
                search.update(rows, active, proposal, best_cur, margin)
        return search.finish()

    @staticmethod
    def _patterns(uniform: torch.Tensor, side: int) -> torch.Tensor:
        """(m, c, side, side) from uniforms (m, 1 + c): per row a bump, transposed with
        probability 1/2, times a random sign per channel (the corners are the reference's
        ``randint(0, h - s)``, drawn with them from the sample's stream)."""
        m, c = uniform.shape[0], uniform.shape[1] - 1
        base = bump(side, uniform.device)
        flip = (uniform[:, 0] < 0.5).view(m, 1, 1, 1)
        oriented = torch.where(flip, base.T, base)
        signs = torch.where(uniform[:, 1:] < 0.5, 1.0, -1.0).view(m, c, 1, 1)
        return oriented * signs

    def _initial(self, x: torch.Tensor, streams: SampleStreams) -> torch.Tensor:
        """The initial pattern (unnormalised): a centred grid of s x s bumps, s = min(h, w) // 5,
        each with its own orientation and sign per sample and channel."""
        n, c, h, w = x.shape
        side = max(min(h, w) // 5, 1)
        grid_h, grid_w = h // side, w // side
        uniform = streams.rand((n, grid_h * grid_w, 1 + c)).view(n * grid_h * grid_w, 1 + c)
        patterns = self._patterns(uniform, side)
        blocks = patterns.view(n, grid_h, grid_w, c, side, side).permute(0, 3, 1, 4, 2, 5)
        delta = torch.zeros_like(x)
        top, left = (h - grid_h * side) // 2, (w - grid_w * side) // 2
        delta[:, :, top : top + grid_h * side, left : left + grid_w * side] = blocks.reshape(
            n, c, grid_h * side, grid_w * side
        )
        return delta
