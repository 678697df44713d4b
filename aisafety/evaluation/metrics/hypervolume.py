"""Adversarial hypervolume, AH (Guo et al., "Exploring the adversarial frontier: quantifying
robustness via adversarial hypervolume", eqs. 3-6 and Algorithm 1).

Per sample, the frontier (``aisafety.evaluation.frontier``) gives the clamped probability
margin F_i at the budgets eps_i = i eps_max / N. The budget axis is normalised to
t_i = eps_i / eps_max in [0, 1] (Algorithm 1 records the points (i/N, L_conf)), the margin is
already in [0, 1], and AH is the area of the region between the reference point (0, 0) and
the frontier points (eq. 4, the union of the boxes [0, t_i] x [0, F_i]). For the monotone
frontier that is the right Riemann sum sum_i (t_i - t_{i-1}) F_i, the paper's "product of the
interval's length and the maximum objective value at the end of the interval". A sample
misclassified at budget 0 has AH = 0; a model whose margin stays at 1 has AH = 1.

Registered metric: ``adversarial-hypervolume`` (a clean metric: it runs its own search).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.frontier import Frontier, adversarial_frontier
from aisafety.interfaces import Capability, Direction, MetricValue, Norm


def hypervolume(levels: torch.Tensor, frontier: torch.Tensor) -> torch.Tensor:
    """Area dominated by the points (levels[j], frontier[:, j]) from the reference (0, 0).

    ``levels`` (N,) ascending in (0, 1]; ``frontier`` (n, N) with values >= 0. The union of
    the boxes [0, t_j] x [0, F_j] covers, over (t_{j-1}, t_j], the height max_{k >= j} F_k.
    """
    widths = torch.diff(levels, prepend=levels.new_zeros(1))
    heights = frontier.flip(1).cummax(1).values.flip(1)
    return heights @ widths


class HypervolumeConfig(PluginConfig):
    norm: Literal["linf", "l2"] = Field(default="linf", description="threat model of the search")
    eps_max: float = Field(default=0.3, gt=0, description="largest budget, [0, 1] pixel scale")
    budgets: int = Field(default=10, gt=0, description="N, grid points eps_max * i / N")
    steps: int = Field(default=10, gt=0, description="APGD steps per budget (warm-started)")
    loss: Literal["prob", "logit"] = Field(
        default="logit", description="search objective: the logit margin (default: the "
        "probability margin's gradient vanishes on saturated softmax, e.g. distillation) or "
        "the probability margin (the paper's); the frontier is always the probability margin",
    )  # fmt: skip
    samples: int | None = Field(default=None, gt=0, description="at most this many samples")


class AdversarialHypervolume(CleanMetric):
    name = "adversarial-hypervolume"
    description = "Mean area under the per-sample adversarial frontier (margin against budget)"
    direction = Direction.HIGHER
    unit = "area in [0, 1]"
    category = "attack-frontier"
    requires = Capability.GRADIENTS
    Config = HypervolumeConfig

    def frontier(self, ctx: EvaluationContext) -> Frontier:
        c = self.config
        index = ctx.subset(c.samples)
        budgets = tuple(c.eps_max * i / c.budgets for i in range(1, c.budgets + 1))
        parts = [
            adversarial_frontier(ctx.predictor, xb, yb, budgets, Norm(c.norm), c.steps, c.loss)
            for xb, yb in zip(
                ctx.x[index].split(ctx.batch_size), ctx.y[index].split(ctx.batch_size), strict=True
            )
        ]
        return Frontier(
            budgets,
            torch.cat([p.margins for p in parts]),
            torch.cat([p.gradients for p in parts]),
        )

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        found = self.frontier(ctx)
        levels = torch.tensor(found.budgets, dtype=torch.float64) / self.config.eps_max
        per_sample = hypervolume(levels, found.margins[:, 1:])
        return [
            self.value(
                float(per_sample.mean()),
                len(per_sample),
                eps=self.config.eps_max,
                std=float(per_sample.std(unbiased=False)),
                norm=self.config.norm,
                budgets=[0.0, *found.budgets],
                per_sample=[round(v, 6) for v in per_sample.tolist()],
                frontier=[[round(v, 6) for v in row] for row in found.margins.tolist()],
                robust_accuracy_at_eps_max=float((found.margins[:, -1] > 0).double().mean()),
                gradients_per_sample=float(found.gradients.double().mean()),
            )
        ]
