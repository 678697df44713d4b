"""APGD's early stop with its batch in buckets (a GPU's default: few batch sizes, few cuDNN
plans) gives the examples and step counts of the batch cut at every step, bit for bit: the
fooled rows that ride along are frozen, and on the CPU a row's scores do not depend on its
batch (on a GPU they may: cuDNN can pick another algorithm per batch size)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import aisafety.attack.apgd as apgd
from aisafety.attack.apgd import APGDCE, APGDT


def _run(monkeypatch, predictor, attack, data, eps, buckets):
    monkeypatch.setattr(apgd, "BUCKETS", buckets)
    sizes, logits = [], predictor._logits

    def watched(batch):
        sizes.append(len(batch))
        return logits(batch)

    monkeypatch.setattr(predictor, "_logits", watched)
    try:
        return attack(predictor, data.x, data.y, eps), sizes
    finally:
        monkeypatch.setattr(predictor, "_logits", logits)


@pytest.mark.parametrize("attack", [APGDCE, APGDT], ids=["apgd-ce", "apgd-t"])
def test_bucketed_batches_give_the_same_examples_with_few_batch_sizes(
    zoo_predictor, mnist_subset, monkeypatch, attack
):
    data = mnist_subset(100)
    steps = 20
    config = {"steps": steps, "early_stop": True, "seed": 0}
    if attack is APGDT:
        config["n_target_classes"] = 3
    cut, cut_sizes = _run(monkeypatch, zoo_predictor, attack(**config), data, 0.15, False)
    kept, kept_sizes = _run(monkeypatch, zoo_predictor, attack(**config), data, 0.15, True)
    assert torch.equal(cut.x_adv, kept.x_adv) and torch.equal(cut.steps, kept.steps)
    broken = int(cut.success.sum())
    assert 0 < broken < len(data.x)  # some rows are fooled along the way, some never
    assert len(set(cut_sizes)) > 2 * len(set(kept_sizes))
    # past each run's first batch, sizes are powers of two; rows riding along cost passes
    powers = {size for size in kept_sizes if size & (size - 1) == 0}
    assert len(set(kept_sizes) - powers) <= 1 + (attack is APGDT) * 3
    assert sum(kept_sizes) > sum(cut_sizes)


def test_next_batch_keeps_the_batch_until_its_open_rows_fit_a_smaller_power():
    idx = torch.arange(10, 20)
    fooled = torch.zeros(30, dtype=torch.bool)
    fooled[11] = True  # 9 open of 10: no power of two below 10 holds them
    same, live = apgd._next_batch(idx, fooled, True)
    assert torch.equal(same, idx) and torch.equal(live, ~fooled[idx])
    fooled[[13, 15]] = True  # 7 open: cut to 8, the open rows in order, then a fooled one
    rows, live = apgd._next_batch(idx, fooled, True)
    assert rows.tolist() == [10, 12, 14, 16, 17, 18, 19, 11]
    assert live.tolist() == [True] * 7 + [False]
    fooled[[10, 12, 14]] = True  # 4 open of 8: cut to 4
    rows, live = apgd._next_batch(rows, fooled, True)
    assert rows.tolist() == [16, 17, 18, 19] and live.all()
    fooled[[16, 18]] = True  # 2 open of 4: cut to 2
    rows, live = apgd._next_batch(rows, fooled, True)
    assert rows.tolist() == [17, 19] and live.all()
    fooled[[17, 19]] = True  # none open: empty
    assert len(apgd._next_batch(rows, fooled, True)[0]) == 0
    # without buckets, the open rows at every step
    fooled[[17]] = False
    rows, live = apgd._next_batch(idx, fooled, False)
    assert rows.tolist() == [17] and live is None


def test_buckets_read_no_more_values_back_than_the_cut_at_every_step(
    zoo_predictor, mnist_subset, monkeypatch
):
    """A GPU waits at every value read back (``nonzero``, ``item``): the buckets' count of
    open rows replaces the mask's ``nonzero``, so a run waits no more often with them."""
    data = mnist_subset(32)

    def reads(buckets: bool) -> int:
        monkeypatch.setattr(apgd, "BUCKETS", buckets)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = APGDCE(steps=20, early_stop=True, seed=0)(zoo_predictor, data.x, data.y, 0.1)
        assert int(result.steps.max()) == 20  # some row moved at every step
        calls = Counter(event.name for event in prof.events())
        return calls["aten::nonzero"] + calls["aten::_local_scalar_dense"]

    cut, kept = reads(False), reads(True)
    assert kept <= cut, (kept, cut)
