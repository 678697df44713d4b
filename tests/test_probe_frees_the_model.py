"""The memory probe (``prediction/footprint.py``) leaves nothing alive after the model.

Its pack hook returned the saved tensor itself: each saved activation then held its own
autograd node, which held it, a cycle through C++ that Python's collector cannot see. The
one-image graph of the probe stayed alive with every weight it saved, after the user's
model was gone: 164 MB per evaluation of a WRN-28-10 in one process (CPU, measured), and on
a GPU the card's memory grew by about 0.15 GiB per evaluated WRN-28-10 and 0.17 GiB per
ResNet-50 (NVIDIA H200, 2026-11-28, `tests/test_at_size.py` with ``device: cuda``)."""

from __future__ import annotations

import gc
import weakref

import torch
from shapes import small_resnet

import aisafety
from aisafety.prediction import footprint
from aisafety.prediction.torch_module import TorchPredictor


def weights_of(module: torch.nn.Module) -> list[weakref.ref]:
    return [weakref.ref(p) for p in module.parameters()]


def test_the_probe_keeps_no_weight_alive():
    module = small_resnet()
    model = TorchPredictor(module, (3, 32, 32), 10)
    assert footprint.image_bytes(model, grad=True) > 0  # the probe ran
    weights = weights_of(module)
    del model, module
    gc.collect()
    assert not [w for w in weights if w() is not None]


def test_an_evaluation_keeps_no_weight_of_the_model_alive(tmp_path):
    module = small_resnet()
    weights = weights_of(module)
    plan = {"dataset": {"name": "cifar10-embedded", "limit": 2}, "metrics": ["ca"],
            "attacks": [{"name": "fgsm", "eps": [0.01]}], "seed": 0}  # fmt: skip
    aisafety.evaluate(plan, db=f"sqlite:///{tmp_path / 'r.db'}",
                      model=TorchPredictor(module, (3, 32, 32), 10))  # fmt: skip
    del module
    gc.collect()
    assert not [w for w in weights if w() is not None]
