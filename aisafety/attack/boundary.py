"""Boundary Attack under the l2 norm (Brendel, Rauber & Bethge, ICLR 2018), decision-based.

"Decision-Based Adversarial Attacks: Reliable Attacks Against Black-Box Machine Learning
Models" (arXiv:1712.04248). The attack needs only the model's top-1 label. It starts from an
input that is already misclassified and walks along the decision boundary towards the clean
image, shrinking the l2 distance while staying adversarial. Each step draws a Gaussian
direction, makes it orthogonal to the direction to the clean image ``x`` and scales it to
``spherical_step * d`` (``d`` the current distance), projects the point back onto the sphere of
radius ``d`` around ``x`` (the orthogonal step), then moves ``source_step * d`` towards ``x``
(the source step); the candidate replaces the current point when it is misclassified and
closer. Step sizes adapt per sample to the success rates, as in the paper: if more than half of
the orthogonal steps stay adversarial both steps grow by ``step_adaptation``, if fewer than a
fifth they shrink; if more than a quarter of the full candidates are adversarial the source
step grows, if fewer than a tenth it shrinks. A sample whose source step falls below
``source_step_convergence`` has converged and stops.

This follows the authors' reference implementation in Foolbox 3 (``BoundaryAttack``: the
proposal geometry, one candidate per step, the thresholds), batched over samples with
per-sample Gaussian draws (Foolbox shares one draw across the batch) and per-sample step
sizes held in tensors. One difference, in the defaults only: Foolbox 3 queries the orthogonal
candidate every 10th step and takes the success rates over windows of 100 orthogonal and 30
full candidates, so the step sizes first adapt after 300 and 1000 steps; on the zoo's MNIST
CNN that walk barely moves (16 test images: median l2 9.9 at the start, 9.3 after 1000 steps
in Foolbox, 9.1 here with its settings). The original implementation (Foolbox 1/2) filled its
windows much faster, by trying up to 25 directions per step. Here the orthogonal candidate is
queried every step (``update_stats_every_k=1``, both candidates in one forward pass; 2 queries
per step) over windows of 20 and 10 candidates: median l2 3.6 after 1000 steps on the same
images. ``update_stats_every_k=10, spherical_window=100, step_window=30`` gives Foolbox 3's.

Initialisation, as the paper: a uniform noise image is drawn per sample; where it is not
misclassified, further draws (at most ``init_draws`` in all) are uniform on ``[0, s]`` with a
random brightness ``s ~ U(0, 1]`` per image, because plain uniform noise can land in one class
almost always (99.8% "8" for the zoo's MNIST CNN, so a sample of that class would need ~500
draws). Then, as Foolbox's blended-noise start, the blend ``(1 - t) x + t noise`` is moved
towards ``x``, here by ``init_search_steps`` bisection steps on ``t`` (the blend kept is
always misclassified). A sample for which no misclassified noise is found is left unchanged.

The base class projects the result into the l2 ball of the budget ``eps``: with a large
``eps`` (``float("inf")``) this is a minimum-norm attack that spends all its steps. With
``early_stop`` a sample stops as soon as its distance is within ``eps``, since going further
cannot change its success at that budget.

``steps`` counts the model queries spent per sample (noise draws, bisection, candidates).
Samples the model already misclassifies (by the call's clean logits) are left as they are with
0 queries (``Attack.skips_misclassified``).
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.attack.base import Attack, AttackConfig
from aisafety.attack.call import AttackCall
from aisafety.attack.streams import SampleStreams
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.prediction.base import Predictor


class BoundaryConfig(AttackConfig):
    steps: int = Field(default=1000, gt=0, description="boundary-walk iterations per sample")
    spherical_step: float = Field(default=1e-2, gt=0, description="initial orthogonal step")
    source_step: float = Field(default=1e-2, gt=0, description="initial step towards x")
    source_step_convergence: float = Field(
        default=1e-7, gt=0, description="a sample whose source step falls below this stops"
    )
    step_adaptation: float = Field(default=1.5, gt=1, description="step-size update factor")
    update_stats_every_k: int = Field(
        default=1, gt=0, description="query the orthogonal candidate every k steps"
    )
    spherical_window: int = Field(
        default=20, gt=0, description="orthogonal candidates a success rate is taken over"
    )
    step_window: int = Field(
        default=10, gt=0, description="full candidates a success rate is taken over"
    )
    init_draws: int = Field(
        default=1000, gt=0, description="uniform noise draws to find a misclassified start"
    )
    init_search_steps: int = Field(
        default=10, ge=0, description="bisection steps blending the start towards x"
    )
    early_stop: bool = Field(
        default=False,
        description="stop a sample once its l2 distance is within eps: fewer queries at a "
        "fixed budget, but the result is then not minimal",
    )


class _Window:
    """Per-sample ring buffer of the last ``length`` outcomes (NaN: not yet observed)."""

    def __init__(self, length: int, n: int, device: torch.device):
        self.data = torch.full((length, n), float("nan"), device=device)
        self.next = 0

    def append(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        self.data[self.next, rows] = values.to(self.data.dtype)
        self.next = (self.next + 1) % self.data.shape[0]

    def full(self, rows: torch.Tensor) -> torch.Tensor:
        return ~self.data[:, rows].isnan().any(0)

    def mean(self, rows: torch.Tensor) -> torch.Tensor:
        return self.data[:, rows].nanmean(0)

    def clear(self, rows: torch.Tensor) -> None:
        self.data[:, rows] = float("nan")


class BoundaryAttack(Attack):
    name = "boundary"
    family = AttackFamily.DECISION
    norm = Norm.L2
    requires = Capability.LABELS
    chunk_independent = True
    description = "Boundary Attack, l2, decision-based random walk (Brendel et al. 2018)"
    Config = BoundaryConfig
    skips_misclassified = True

    def perturb(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float, call: AttackCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            return self._walk(predictor, x, y, eps, call.streams)

    def _start(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, streams: SampleStreams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A misclassified blend of uniform noise and ``x`` per sample (where one is found)."""
        cfg = self.config
        m = len(x)
        used = torch.zeros(m, dtype=torch.long, device=x.device)
        noise = torch.zeros_like(x)
        found = torch.zeros(m, dtype=torch.bool, device=x.device)
        for attempt in range(cfg.init_draws):
            rows = torch.nonzero(~found).squeeze(1)
            if not len(rows):
                break
            draw = streams[rows].rand((len(rows), *x.shape[1:]))
            if attempt:  # later draws: uniform on [0, s], a random brightness s per image
                draw *= 1 - streams[rows].rand((len(rows), 1, 1, 1))
            adv = predictor.predict(draw) != y[rows]
            used[rows] += 1
            noise[rows[adv]] = draw[adv]
            found[rows[adv]] = True
        rows = torch.nonzero(found).squeeze(1)
        x_f, noise_f, y_f = x[rows], noise[rows], y[rows]
        low = torch.zeros(len(rows), device=x.device)
        high = torch.ones(len(rows), device=x.device)  # the blend at ``high`` is adversarial
        for _ in range(cfg.init_search_steps if len(rows) else 0):
            mid = (low + high) / 2
            t = mid[:, None, None, None]
            adv = predictor.predict((1 - t) * x_f + t * noise_f) != y_f
            high = torch.where(adv, mid, high)
            low = torch.where(adv, low, mid)
        used[rows] += cfg.init_search_steps
        t = high[:, None, None, None]
        start = x.clone()
        start[rows] = (1 - t) * x_f + t * noise_f
        return start, found, used

    def _walk(
        self,
        predictor: Predictor,
        x: torch.Tensor,
        y: torch.Tensor,
        eps: float,
        streams: SampleStreams,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        best, found, used = self._start(predictor, x, y, streams)
        m = len(x)
        spherical = torch.full((m,), cfg.spherical_step, device=x.device)
        source = torch.full((m,), cfg.source_step, device=x.device)
        stats_spherical = _Window(cfg.spherical_window, m, x.device)
        stats_step = _Window(cfg.step_window, m, x.device)
        adapt = cfg.step_adaptation
        active = torch.nonzero(found).squeeze(1)
        for step in range(1, cfg.steps + 1):
            if len(active):
                distance = (x[active] - best[active]).flatten(1).norm(dim=1)
                keep = source[active] >= cfg.source_step_convergence
                if cfg.early_stop:
                    keep &= distance > eps
                active = active[keep]
            if not len(active):
                break
            xa, ya = x[active], y[active]
            candidates, orthogonal, distance = self._propose(
                xa, best[active], spherical[active], source[active], streams[active]
            )
            with_stats = step % cfg.update_stats_every_k == 0
            if with_stats:  # both candidates in one forward pass
                labels = predictor.predict(torch.cat([candidates, orthogonal]))
                is_adv, orthogonal_adv = (labels != ya.repeat(2)).chunk(2)
                used[active] += 2
            else:
                is_adv = predictor.predict(candidates) != ya
                used[active] += 1
            closer = (xa - candidates).flatten(1).norm(dim=1) < distance
            improved = is_adv & closer
            best[active[improved]] = candidates[improved]
            if not with_stats:
                continue
            stats_spherical.append(active, orthogonal_adv)
            stats_step.append(active, is_adv)
            # orthogonal success rate: both steps grow (too linear) or shrink (too curved)
            full = stats_spherical.full(active)
            rate = stats_spherical.mean(active)
            grow, shrink = full & (rate > 0.5), full & (rate < 0.2)
            factor = torch.where(grow, adapt, torch.where(shrink, 1 / adapt, 1.0))
            spherical[active] *= factor
            source[active] *= factor
            stats_spherical.clear(active[grow | shrink])
            # full-candidate success rate: the source step alone
            full = stats_step.full(active)
            rate = stats_step.mean(active)
            grow, shrink = full & (rate > 0.25), full & (rate < 0.1)
            source[active] *= torch.where(grow, adapt, torch.where(shrink, 1 / adapt, 1.0))
            stats_step.clear(active[grow | shrink])
        return best, used

    @staticmethod
    def _propose(
        x: torch.Tensor,
        current: torch.Tensor,
        spherical: torch.Tensor,
        source: torch.Tensor,
        streams: SampleStreams,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The full candidate, the orthogonal candidate and the current distance per sample."""
        shape = x.shape
        x, current = x.flatten(1), current.flatten(1)
        towards = x - current
        distance = towards.norm(dim=1)
        direction = towards / distance[:, None]
        eta = streams.randn(current.shape)
        eta = eta - (eta * direction).sum(1, keepdim=True) * direction
        eta = eta * (spherical * distance / eta.norm(dim=1))[:, None]
        # back onto the sphere of radius ``distance`` around x (Pythagoras), then clip
        orthogonal = x + (eta - towards) / (spherical.square() + 1).sqrt()[:, None]
        orthogonal = orthogonal.clamp(0, 1)
        to_source = x - orthogonal
        to_source_norm = to_source.norm(dim=1)
        # a step of source * distance, corrected for the clipping's change of radius
        length = (source * distance + to_source_norm - distance).clamp_min(0)
        candidate = orthogonal + (length / to_source_norm.clamp_min(1e-12))[:, None] * to_source
        candidate = candidate.clamp(0, 1)
        return candidate.view(shape), orthogonal.view(shape), distance
