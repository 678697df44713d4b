"""bench/scale.py measures what it says: its images are labelled with the model's own
predictions, so no capability skips one, and Square spends its full query budget on every
image (its linearity then counts images, not the share a random net happens to get right).

The bench itself is what is tested, so it runs as a script, as it is run (a test importing
it would tie the bench's internals to the suite); why it labels so is a property of Square,
tested on the package alone."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

from aisafety.attack.square import SquareLinf
from aisafety.database.small_residual import small_residual
from aisafety.prediction.torch_module import TorchPredictor
from tests import children

ROOT = Path(__file__).resolve().parents[1]
OTHERS = ["forward", "fgsm", "pgd-10", "gaussian_noise", "smoothing n=20", "neuron outputs",
          "ibp", "crown-ibp", "crown"]  # fmt: skip


def test_square_spends_every_query_on_the_bench_images():
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    command = [sys.executable, "bench/scale.py", "--quick", "--only", "ratios",
               "--shape", "small-resnet-32", "--skip", *OTHERS]  # fmt: skip
    done = children.run(
        command, cwd=ROOT, what="bench/scale.py", capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counted = re.search(r"square-100: (\d+) of (\d+) images \(all calls\) stopped", done.stdout)
    assert counted, done.stdout[-2000:]
    assert counted[1] == "0" and int(counted[2]) >= 8  # the round alone has 8 images


def test_random_labels_would_leave_the_images_unattacked():
    """The cause of the 0.40 Square read before: with random labels a random net is wrong
    on most images, which Square skips with 0 queries."""
    model = TorchPredictor(small_residual(8), (3, 16, 16), 10, name="small-residual")
    x = torch.rand(32, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        predicted = model.logits(x).argmax(1)
    shift = torch.randint(1, 10, (32,), generator=torch.Generator().manual_seed(1))
    wrong = (predicted + shift) % 10
    skipped = SquareLinf(queries=100)(model, x, wrong, 2 / 255).steps
    assert (skipped == 0).all()
    right = SquareLinf(queries=100)(model, x, predicted, 2 / 255).steps
    assert (right > 0).all()  # the same images, rightly labelled, are queried
