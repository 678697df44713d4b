"""bench/scale.py measures what it says: its images are labelled with the model's own
predictions, so no capability skips one, and Square spends its full query budget on every
image (its linearity then counts images, not the share a random net happens to get right)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import scale  # noqa: E402


def test_the_labels_are_the_predictions_and_square_spends_every_query():
    table, model = scale.jobs("small-resnet", 32)
    x, y = scale.data(model, 6)
    assert torch.equal(model.logits(x).argmax(1), y)
    scale.SHORT[:] = [0, 0]
    table[f"square-{scale.QUERIES}"](x, y)
    assert scale.SHORT == [0, 6]


def test_random_labels_would_leave_most_images_unattacked():
    """The cause of the 0.40 Square read before: with random labels a random net is wrong
    on most images, which Square skips with 0 queries."""
    table, model = scale.jobs("small-resnet", 32)
    x, y = scale.data(model, 32)
    wrong = (y + torch.randint(1, 10, y.shape, generator=torch.Generator().manual_seed(1))) % 10
    scale.SHORT[:] = [0, 0]
    table[f"square-{scale.QUERIES}"](x, wrong)
    assert scale.SHORT == [32, 32]
