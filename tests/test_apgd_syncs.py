"""APGD's steps read nothing back from the device but the early stop's new batch: its
bookkeeping runs by ``where`` over the active rows, not by boolean masks (each of which is a
``nonzero``, a device synchronisation on a GPU: seven a step before)."""

from __future__ import annotations

from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from aisafety.attack.apgd import APGDCE, checkpoints


def test_an_apgd_step_synchronises_once(zoo_predictor, mnist_subset):
    data = mnist_subset(32)
    steps = 20
    attack = APGDCE(steps=steps, early_stop=True, seed=0)
    clean = zoo_predictor.logits(data.x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = attack(zoo_predictor, data.x, data.y, 0.1, clean_logits=clean)
    calls = Counter(event.name for event in prof.events())
    assert int(result.steps.max()) == steps  # some sample moved at every step
    # one per step and one before the first (the early stop's rows), one per checkpoint (the
    # rows whose step size is halved) and a few around the run (the restart's rows); the
    # boolean masks made it 179 here
    allowed = steps + len(checkpoints(steps)) + 6
    assert calls["aten::nonzero"] <= allowed, calls["aten::nonzero"]
    assert calls["aten::nonzero"] >= steps  # the count sees the early stop's
    assert torch.isfinite(result.x_adv).all()
