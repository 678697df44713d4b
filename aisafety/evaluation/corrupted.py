"""Corruption artifacts: predictions on corrupted sets and on perturbation sequences.

A corrupted set (corruption, severity) is generated once, run through the model once, and
only the predicted labels are kept: 19 corruptions x 5 severities of a dataset would
otherwise hold 95 copies of it in memory. Generation is seeded, so the same set can be rebuilt
exactly for another model.

Both draw their randomness per fixed block of images, whose size depends only on the image
size (``block_images``): block 0 with the plan's seed, block i with a seed derived from it
and i. So the numbers do not depend on the evaluation batch size or on the memory budget,
and the budget can take as many blocks at a time as fit (``aisafety/memory_budget.py``)
instead of refusing a set that does not fit at once. Perturbation sequences are run through
the evaluated model and, when there is one, the reference model in the same pass.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from aisafety.corruption import NOISE_SEQUENCES, corrupt, sequence
from aisafety.evaluation.inference import batched_predictions
from aisafety.memory_budget import fitting
from aisafety.prediction.base import Predictor

# float32 copies of an image a corruption holds at once, with a margin: measured at 224x224,
# severity 5, per image of a batch of 8: elastic_transform 14.8, snow 8.5, others 2.8-7.9
CORRUPTION_IMAGE_COPIES = 24
CORRUPTION_BLOCK_VALUES = 1 << 20  # values per random block: 256 CIFAR images, 4 at 224x224
SEQUENCE_CHUNK = 64  # images per sequence block at most: 64 x 31 frames of CIFAR-10 is ~24 MB
SEQUENCE_BLOCK_VALUES = SEQUENCE_CHUNK * 3 * 32 * 32  # so 64 up to 32x32, 1 at 224x224
SEQUENCE_FRAME_COPIES = 2  # the frames' list and their stack
SEQUENCE_EXTRA_COPIES = 8  # a frame's temporaries (a blur's, a warp's), with a margin


def block_images(values_per_image: int, block_values: int, most: int | None = None) -> int:
    """Images per random block: the largest power of two whose values stay within
    ``block_values`` (at least 1, at most ``most``). A function of the image size only."""
    fit = max(1, block_values // max(1, values_per_image))
    size = 1 << (fit.bit_length() - 1)
    return size if most is None else min(size, most)


def block_seed(seed: int, index: int) -> int:
    """Block 0 keeps ``seed`` (a set of one block draws what one call with ``seed`` draws);
    block i > 0 a seed derived from ``seed`` and i, so no two blocks repeat each other."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


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
    severity table ``table``: shape (N,). Each block of images (``block_images``) is
    corrupted with its own seed; as many blocks as fit the memory budget are corrupted and
    predicted at a time, so the labels are the same under any budget. Refused before any
    work when one block does not fit."""
    values = 3 * x[0, 0].numel() if len(x) else 0  # a grey image is corrupted as RGB
    block = block_images(values, CORRUPTION_BLOCK_VALUES)
    per_block = CORRUPTION_IMAGE_COPIES * block * values * max(4, x.element_size())
    n_blocks = -(-len(x) // block)
    per_chunk = fitting(
        f"corruption {name!r} on {len(x)} images of shape {tuple(x.shape[1:])} ({block} "
        f"images per random block, {CORRUPTION_IMAGE_COPIES} copies of each)",
        per_block,
        max(1, n_blocks),
        "raise limits.memory_gib to at least that",
    )
    labels = []
    for first in range(0, n_blocks, per_chunk):
        blocks = range(first, min(n_blocks, first + per_chunk))
        corrupted = torch.cat([
            corrupt(x[i * block : (i + 1) * block], name, severity, block_seed(seed, i), table)
            for i in blocks
        ])  # fmt: skip
        labels.append(batched_predictions(predictor, corrupted, batch_size))
        del corrupted
    return torch.cat(labels) if labels else torch.empty(0, dtype=torch.long)


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
    """Per-frame predicted labels (N, n_frames) of each predictor on sequence ``name``,
    one block of images (``block_images``) at a time, block i seeded with ``seed + i``;
    refused before any work when one block's frames do not fit the memory budget."""
    values = x[0].numel() if len(x) else 0
    block = block_images(values, SEQUENCE_BLOCK_VALUES, SEQUENCE_CHUNK)
    copies = SEQUENCE_FRAME_COPIES * n_frames + SEQUENCE_EXTRA_COPIES
    fitting(
        f"perturbation sequence {name!r} of {n_frames} frames on images of shape "
        f"{tuple(x.shape[1:])} ({block} images per block)",
        copies * block * values * max(4, x.element_size()),
        1,
        "lower n_frames or raise limits.memory_gib",
    )
    outputs: list[list[torch.Tensor]] = [[] for _ in predictors]
    for index, start in enumerate(range(0, len(x), block)):
        chunk = x[start : start + block]
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
