"""The memory budget's estimate covers the input defenses in front of a model: each
defense's transform copies and an attacker's EOT passes (``prediction/footprint.py``,
``transform_copies`` and ``passes`` in ``defense/base.py``). Before, the estimate was the
bare model's, and a forward-backward pass through a median filter of size 5 or EOT over 4
draws grew the process by 2.4x and 3.3x that estimate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from aisafety.defense.jpeg import JpegCompression
from aisafety.defense.median_filter import MedianFilter
from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.prediction import footprint
from aisafety.prediction.torch_module import TorchPredictor

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
import children  # noqa: E402
from cifar_resnets import random_resnet  # noqa: E402

# (defense class, its config): pointwise, convolutional, codec, windowed, random with EOT
CASES = [
    ("bit_depth", "BitDepthReduction", {}),
    ("spatial_smoothing", "SpatialSmoothing", {}),
    ("jpeg", "JpegCompression", {}),
    ("median_filter", "MedianFilter", {"size": 5}),
    ("resize_pad", "RandomResizePad", {"eot_samples": 4}),
    ("median_filter", "MedianFilter", {"size": 2, "eot_samples": 4}),
]

SCRIPT = """
import ctypes, json, sys, torch
sys.path.insert(0, {tests!r})
from importlib import import_module
from cifar_resnets import random_resnet
from aisafety.prediction import footprint
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.unit_cost import reset_peak_rss, status_bytes
torch.set_num_threads(1)
libc = ctypes.CDLL("libc.so.6")
model = TorchPredictor(random_resnet(blocks=(1, 1), width=8), (3, 224, 224), 10, name="res")
x = torch.rand(8, 3, 224, 224, generator=torch.Generator().manual_seed(0))
out = []
for module, name, config in {cases!r}:
    defended = getattr(import_module("aisafety.defense." + module), name)(model, config)
    estimate = len(x) * footprint.image_bytes(defended, True)
    libc.malloc_trim(0)  # the heap freed by the case before goes back: this one's growth
    reset_peak_rss()
    before = status_bytes("VmRSS")
    xg = x.clone().requires_grad_(True)
    torch.autograd.grad(defended.logits(xg).sum(), xg)
    out.append((name, config, status_bytes("VmHWM") - before, estimate))
    del xg
print(json.dumps(out))
"""


def test_the_estimate_covers_each_defense_in_a_measured_pass():
    """Peak resident growth of a forward-backward pass of 8 images at 224x224 through each
    defense, in a fresh process, against 8 times the estimate of one image."""
    script = SCRIPT.format(tests=str(TESTS), cases=CASES)
    # time bounded only by the hang guard: a fixed 600 s can run out on a loaded machine
    done = children.run(
        [sys.executable, "-c", script], what="the defense-memory script", capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for name, config, grown, estimate in json.loads(done.stdout.splitlines()[-1]):
        assert 20 << 20 < grown <= estimate, (name, config, grown, estimate)


def _model() -> TorchPredictor:
    return TorchPredictor(random_resnet(blocks=(1, 1), width=8), (3, 32, 32), 10, name="res")


def test_eot_multiplies_the_attackers_passes_and_a_transform_adds_its_copies():
    model = _model()
    image = 4 * 3 * 32 * 32
    bare = footprint.image_bytes(model, True)
    jpeg = footprint.image_bytes(JpegCompression(model, eot_samples=3), True)
    assert jpeg == int(3 * (bare - footprint.INPUT_COPIES * image) + (3 * 40 + 4) * image)
    assert footprint.image_bytes(JpegCompression(model, eot_samples=3), False) == int(
        footprint.image_bytes(model, False) + 40 * image
    )
    outer = MedianFilter(JpegCompression(model, eot_samples=2), size=3, eot_samples=2)
    assert footprint.defense_costs(outer, True) == (4, 2 * (6 * 9 + 8) + 4 * 40)


def test_smoothing_counts_eot_passes_only_with_bpda():
    model = _model()
    assert footprint.defense_costs(RandomizedSmoothing(model, eot_samples=5), True)[0] == 1
    smoothing = RandomizedSmoothing(model, eot_samples=5, bpda=True)
    assert footprint.defense_costs(smoothing, True) == (5, 10.0)
    assert footprint.defense_costs(smoothing, False) == (1, 2.0)
