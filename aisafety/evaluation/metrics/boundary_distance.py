"""Distance to the decision boundary: EBD (random orthogonal directions) and EBD-2 (steps of
an iterative attack). AISafety eq. 20 and Table V, after He, Li & Song (ICLR 2018).

Both measure correctly classified samples only: a misclassified sample is on the wrong side
of the boundary already (distance 0 would say nothing about the model's margin). A search
that never changes the prediction within its limit counts as the limit (a lower bound); how
often that happened is in ``details['censored']``.

Registered metrics: ``ebd``, ``ebd2``.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from aisafety.attack.apgd import ranked_targets
from aisafety.attack.bim import BIM
from aisafety.config_base import PluginConfig
from aisafety.evaluation.base import CleanMetric
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.inference import batched_logits, batched_predictions
from aisafety.interfaces import Capability, Direction, MetricValue
from aisafety.memory_budget import fitting
from aisafety.prediction.base import Predictor

CHUNK = 64  # samples per search chunk: 64 x m directions x one grid level per forward batch
DIRECTION_BYTES = 3 * 8  # per direction element: the Gaussian, Q and QR's workspace, float64
COPY_BYTES = 6 * 4  # float32 copies: directions, repeated inputs, moved, clipped, bisection


def search_chunk(predictor: Predictor, m: int) -> int:
    """Samples per search chunk: ``CHUNK``, or fewer where their directions (float64, with
    QR's workspace) and moved copies would not fit the memory budget. A smaller chunk draws
    the later samples' directions in other blocks, so where the budget binds the distance
    is measured along other (equally random) directions."""
    dim = math.prod(predictor.input_shape)
    per_sample = m * dim * (DIRECTION_BYTES + COPY_BYTES)
    return fitting(
        f"metric 'ebd' on model {predictor.name!r} ({m} directions of one image of shape "
        f"{tuple(predictor.input_shape)})",
        per_sample,
        CHUNK,
        "lower its n_directions, or raise 'limits: {memory_gib: ...}' in the plan if the "
        "machine has the memory",
        predictor.device,
    )


def evaluated_samples(ctx: EvaluationContext, limit: int | None, seed: int) -> torch.Tensor:
    """Indices of (at most ``limit``, drawn with ``seed``) correctly classified samples."""
    correct = torch.nonzero(ctx.clean_correct).flatten()
    if limit is None or limit >= len(correct):
        return correct
    order = torch.randperm(len(correct), generator=torch.Generator().manual_seed(seed))
    return correct[order[:limit]].sort().values


def random_orthonormal_directions(
    n: int, dim: int, m: int, generator: torch.Generator
) -> torch.Tensor:
    """(n, m, dim): for each of n samples, m orthonormal directions (QR of a Gaussian matrix,
    uniformly distributed on the Stiefel manifold up to column signs)."""
    gaussian = torch.randn(n, dim, m, generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(gaussian)
    return q.transpose(1, 2).float()


def _moved(x: torch.Tensor, u: torch.Tensor, rms: torch.Tensor) -> torch.Tensor:
    """x + (rms * sqrt(d)) u, clipped to [0, 1]: a move of RMS ``rms`` before clipping."""
    dim = x[0].numel()
    step = (rms * math.sqrt(dim)).view(-1, *([1] * (x.dim() - 1)))
    return (x + step * u.view_as(x)).clamp(0.0, 1.0)


def boundary_distances(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    directions: torch.Tensor,
    max_rms: float,
    levels: int,
    refine: int,
    batch_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample, the smallest RMS distance along any of its directions (n, m, d) at which the
    prediction is no longer ``y``, and whether the search found one within ``max_rms``.

    A grid of ``levels`` RMS values is walked outward for all directions of the samples not
    yet flipped; at the first level where some direction flips, bisection (``refine`` halvings)
    narrows each flipping direction's crossing, and the smallest is kept. The distance is the
    RMS of the clipped perturbation, the change the model actually saw.
    """
    n, m = directions.shape[:2]
    xs = x.repeat_interleave(m, dim=0)  # (n*m, C, H, W): row i*m + j is sample i, direction j
    ys = y.repeat_interleave(m)
    us = directions.reshape(n * m, -1)
    distance = torch.full((n,), max_rms, dtype=torch.float64)
    found = torch.zeros(n, dtype=torch.bool)
    step = max_rms / levels
    for level in range(1, levels + 1):
        rows = torch.nonzero((~found).repeat_interleave(m)).flatten()
        if not len(rows):
            break
        r = torch.full((len(rows),), level * step)
        pred = batched_predictions(predictor, _moved(xs[rows], us[rows], r), batch_size)
        rows = rows[pred != ys[rows]]
        if not len(rows):
            continue
        lo = torch.full((len(rows),), (level - 1) * step)
        hi = torch.full((len(rows),), level * step)
        for _ in range(refine):
            mid = (lo + hi) / 2
            wrong = batched_predictions(predictor, _moved(xs[rows], us[rows], mid), batch_size)
            wrong = wrong != ys[rows]
            hi, lo = torch.where(wrong, mid, hi), torch.where(wrong, lo, mid)
        moved = _moved(xs[rows], us[rows], hi) - xs[rows]
        rms = moved.flatten(1).double().pow(2).mean(1).sqrt()
        samples = rows // m
        best = torch.full((n,), math.inf, dtype=torch.float64).scatter_reduce(
            0, samples, rms, reduce="amin"
        )
        newly = torch.isfinite(best)
        distance[newly], found[newly] = best[newly], True
    return distance, found


class EBDConfig(PluginConfig):
    n_directions: int = Field(default=20, ge=1, description="random orthogonal directions m")
    max_rms: float = Field(default=0.5, gt=0, description="search limit, RMS in [0, 1] scale")
    levels: int = Field(default=20, ge=1, description="grid levels up to max_rms")
    refine: int = Field(default=6, ge=0, description="bisection halvings of the crossing level")
    samples: int | None = Field(default=None, gt=0, description="at most this many samples")
    seed: int = 0


class EmpiricalBoundaryDistance(CleanMetric):
    """AISafety eq. 20: the mean over samples of the minimum, over m random orthogonal
    directions, of the RMS distance to the nearest prediction change."""

    name = "ebd"
    description = "Mean RMS distance to the decision boundary along random orthogonal directions"
    direction = Direction.HIGHER
    unit = "rms"
    category = "structure"
    requires = Capability.LABELS
    Config = EBDConfig

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        cfg = self.config
        index = evaluated_samples(ctx, cfg.samples, cfg.seed)
        generator = torch.Generator().manual_seed(cfg.seed)
        distances, found = [], []
        chunk = search_chunk(ctx.predictor, cfg.n_directions)
        for start in range(0, len(index), chunk):
            part = index[start : start + chunk]
            x = ctx.x[part]
            u = random_orthonormal_directions(len(part), x[0].numel(), cfg.n_directions, generator)
            d, f = boundary_distances(
                ctx.predictor, x, ctx.y[part], u, cfg.max_rms, cfg.levels, cfg.refine,
                ctx.batch_size,
            )  # fmt: skip
            distances.append(d)
            found.append(f)
        if not distances:
            return [self.value(math.nan, 0)]
        d, f = torch.cat(distances), torch.cat(found)
        return [self.value(d.mean(), len(d), censored=int((~f).sum()), max_rms=cfg.max_rms)]


class EBD2Config(PluginConfig):
    step_size: float = Field(default=0.001, gt=0, description="BIM step alpha, l_inf, [0, 1]")
    max_steps: int = Field(default=500, ge=1, description="search limit in steps")
    samples: int | None = Field(default=100, gt=0, description="at most this many samples")
    n_target_classes: int | None = Field(
        default=None,
        gt=0,
        description="targets: the classes with the highest clean logits; None: every other "
        "class (the paper's). Fewer give an upper bound, for models of many classes",
    )
    seed: int = 0


def steps_to_boundary(
    predictor: Predictor,
    x: torch.Tensor,
    y: torch.Tensor,
    step_size: float,
    max_steps: int,
    clean_logits: torch.Tensor | None = None,
    n_targets: int | None = None,
) -> torch.Tensor:
    """Per sample, the fewest targeted-BIM steps towards any class j != y after which the
    prediction is no longer y (``max_steps + 1`` when none within the limit).

    Every (sample, target) pair is one row of a targeted ``bim`` call with early stop: a row
    stops moving at its first misclassified iterate, so its step count is the number of
    steps that changed the prediction. The budget eps = 1 spans the whole [0, 1] box, so
    only the box limits a step, as in the paper's unbounded search. The targets are every
    other class, or the ``n_targets`` with the highest clean logits.

    The rows go nearest class first (highest clean logit, as APGD-T ranks its targets), in
    blocks under the memory budget. BIM has no randomness and its first s steps do not
    depend on how many follow, so a block runs only the steps that could still lower one of
    its samples' counts, and a sample at 1 step (the fewest) takes no more rows: the same
    counts as every row run to ``max_steps``, for far fewer passes on a 1,000-class model.
    """
    n, k = len(x), predictor.num_classes
    count = k - 1 if n_targets is None else min(n_targets, k - 1)
    owner = torch.arange(n).repeat(count)
    # rows in blocks under the memory budget: each row is a copy of its image, and an
    # ImageNet model has 999 targets per sample (1.2 GB of rows for 2 images at 224x224)
    block = max(1, _row_block(predictor, _bim(max_steps, step_size), len(owner)))
    if clean_logits is None:
        clean_logits = batched_logits(predictor, x, len(x))
    targets = ranked_targets(clean_logits.cpu(), y.cpu(), count).T.reshape(-1)  # rank-major
    steps = torch.full((n,), max_steps + 1, dtype=torch.long)
    for rows in torch.arange(len(owner)).split(block):
        limit = steps[owner[rows]] - 1  # fewer steps than this could lower the count
        rows = rows[limit >= 1]
        if not len(rows):
            continue
        who = owner[rows]
        result = _bim(int(limit.max()), step_size)(
            predictor, x[who], y[who], 1.0, chunk_size=len(rows), target=targets[rows],
            samples=rows, clean_logits=clean_logits[who],
        )  # fmt: skip
        row_steps = torch.where(result.success.cpu(), result.steps.cpu(), max_steps + 1)
        steps = steps.scatter_reduce(0, who, row_steps, reduce="amin")
    return steps


def _bim(steps: int, step_size: float) -> BIM:
    return BIM(steps=steps, step_size=step_size, early_stop=True)


def _row_block(predictor: Predictor, bim: BIM, rows: int) -> int:
    """(sample, target) rows per BIM call that fit the memory budget: BIM's own peak per
    image, plus the row's input, its adversarial copy and its clean copy (float32)."""
    per_row = bim.image_memory(predictor) + 3 * 4 * math.prod(predictor.input_shape)
    return fitting(
        f"metric 'ebd2' on model {predictor.name!r} (one targeted BIM row of an image of "
        f"shape {tuple(predictor.input_shape)})",
        per_row,
        rows,
        "raise 'limits: {memory_gib: ...}' in the plan if the machine has the memory",
        predictor.device,
    )


class EmpiricalBoundaryDistance2(CleanMetric):
    """EBD-2 (AISafety, Table V): the boundary distance counted in steps of a targeted BIM of
    step ``alpha`` towards each other class; per sample the fewest steps over the classes."""

    name = "ebd2"
    description = "Mean number of targeted-BIM steps (nearest class) that change a prediction"
    direction = Direction.HIGHER
    unit = "steps"
    category = "structure"
    requires = Capability.GRADIENTS
    Config = EBD2Config

    def compute(self, ctx: EvaluationContext) -> list[MetricValue]:
        cfg = self.config
        index = evaluated_samples(ctx, cfg.samples, cfg.seed)
        parts = [
            steps_to_boundary(
                ctx.predictor,
                ctx.x[part],
                ctx.y[part],
                cfg.step_size,
                cfg.max_steps,
                ctx.clean_logits[part],
                cfg.n_target_classes,
            )  # fmt: skip
            for part in index.split(CHUNK)
            if len(part)  # an empty index splits into one empty part
        ]
        if not parts:
            return [self.value(math.nan, 0)]
        steps = torch.cat(parts)
        censored = steps > cfg.max_steps
        value = steps.clamp_max(cfg.max_steps).double().mean()
        return [
            self.value(
                value,
                len(steps),
                censored=int(censored.sum()),
                step_size=cfg.step_size,
                n_target_classes=cfg.n_target_classes,
            )  # fmt: skip
        ]
