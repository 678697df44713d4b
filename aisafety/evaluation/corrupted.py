"""Corruption artifacts: predictions on corrupted sets and on perturbation sequences.

A corrupted set (corruption, severity) is generated once, run through the model once, and
only the predicted labels are kept: 19 corruptions x 5 severities of a dataset would
otherwise hold 95 copies of it in memory. Generation is seeded, so the same set can be rebuilt
exactly for another model.

Perturbation sequences are generated in fixed chunks of images (each seeded with the seed and
its chunk index, so results do not depend on the evaluation batch size) and run through the
evaluated model and, when there is one, the reference model in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aisafety.corruption import NOISE_SEQUENCES, corrupt, sequence
from aisafety.errors import MemoryBudgetError
from aisafety.evaluation.inference import batched_predictions
from aisafety.memory_budget import current_budget, fitting, size
from aisafety.prediction.base import Predictor

# float32 copies of an image a corruption holds at once, with a margin: measured at 224x224,
# severity 5, per image of a batch of 8: elastic_transform 14.8, snow 8.5, others 2.8-7.9
CORRUPTION_IMAGE_COPIES = 24
SEQUENCE_CHUNK = 64  # images per generated chunk: 64 x 31 frames of CIFAR-10 is ~24 MB


def sample_subset(n: int, samples: int | None, seed: int) -> torch.Tensor:
    """Sorted indices of ``samples`` of ``n`` items drawn with ``seed`` (all when None)."""
    if samples is None or samples >= n:
        return torch.arange(n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[:samples].sort().values


def corrupted_predictions(
    predictor: Predictor,
    x: torch.Tensor,
    name: str,
    severity: int,
    seed: int,
    batch_size: int,
    table: str = "auto",
) -> torch.Tensor:
    """Labels the model predicts on ``x`` corrupted by ``name`` at ``severity`` with the
    severity table ``table``: shape (N,). A corruption draws for its whole batch at once
    (its numbers depend on the batch), so it is refused, not split, when the batch's copies
    do not fit the memory budget (``aisafety/memory_budget.py``)."""
    per_image = CORRUPTION_IMAGE_COPIES * x[:1].numel() * x.element_size()
    fits = fitting(
        f"corruption {name!r} on {len(x)} images of shape {tuple(x.shape[1:])}",
        per_image,
        len(x),
        "lower corruptions.samples or raise limits.memory_gib",
    )
    if fits < len(x):
        raise MemoryBudgetError(
            f"corruption {name!r} holds about {CORRUPTION_IMAGE_COPIES} copies of each of its "
            f"{len(x)} images at once ({size(per_image * len(x))}), over the memory budget of "
            f"{size(current_budget())}: {fits} images fit; set corruptions.samples to at most "
            f"{fits} or raise limits.memory_gib"
        )
    return batched_predictions(predictor, corrupt(x, name, severity, seed, table), batch_size)


@dataclass
class SequencePredictions:
    """Predicted labels per frame, (N, T), of the model and (optionally) the reference."""

    name: str
    model: torch.Tensor
    reference: torch.Tensor | None

    @property
    def compares_to_first_frame(self) -> bool:
        return self.name in NOISE_SEQUENCES


def sequence_predictions(
    predictors: list[Predictor],
    x: torch.Tensor,
    name: str,
    n_frames: int,
    seed: int,
    batch_size: int,
) -> list[torch.Tensor]:
    """Per-frame predicted labels (N, n_frames) of each predictor on sequence ``name``."""
    outputs: list[list[torch.Tensor]] = [[] for _ in predictors]
    for index, start in enumerate(range(0, len(x), SEQUENCE_CHUNK)):
        chunk = x[start : start + SEQUENCE_CHUNK]
        frames = sequence(chunk, name, n_frames, seed=seed + index)  # (n, T, C, H, W)
        flat = frames.flatten(0, 1)
        for out, predictor in zip(outputs, predictors, strict=True):
            out.append(batched_predictions(predictor, flat, batch_size).view(len(chunk), -1))
    return [
        torch.cat(out) if out else torch.empty(0, n_frames, dtype=torch.long) for out in outputs
    ]


def flip_probability(predictions: torch.Tensor, compare_to_first: bool) -> float:
    """Hendrycks & Dietterich's flip probability of per-frame labels (N, T).

    Noise sequences (frames are independent draws) compare every frame with the first, clean
    one; smooth sequences compare consecutive frames (AISafety eq. 14).
    """
    if predictions.shape[1] < 2 or len(predictions) == 0:
        return float("nan")
    previous = predictions[:, :1] if compare_to_first else predictions[:, :-1]
    flips = predictions[:, 1:] != previous
    return float(flips.double().mean())
