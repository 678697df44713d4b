"""Square's redraws read ahead in each sample's stream (the GPU path) give exactly the
numbers of the reference's one-by-one loop: same adversarial images, same query counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import aisafety.attack.square as square
from aisafety.attack.square import SquareLinf
from aisafety.attack.streams import BUFFER, SampleStreams
from aisafety.prediction.torch_module import TorchPredictor


def test_peeked_draws_are_the_draws_and_consuming_them_keeps_the_stream():
    drawn = SampleStreams(5, torch.arange(4))
    peeked = SampleStreams(5, torch.arange(4))
    drawn.rand((4, 3)), peeked.rand((4, 3))  # both buffers filled, 3 numbers used
    ahead = peeked.available_uniforms(3)
    assert (ahead == (BUFFER - 3) // 3).all()
    look = peeked.peek_uniforms(3, 5)
    one_by_one = torch.stack([drawn.rand((4, 3)) for _ in range(5)], 1)
    assert torch.equal(torch.from_numpy(look), one_by_one)  # peeked on the host
    peeked.consume_uniforms(3, np.full(4, 5))
    # then up to and across the end of the buffer (a refill), the two streams agree
    for _ in range(BUFFER // 3 + 2):
        assert torch.equal(peeked.rand((4, 3)), drawn.rand((4, 3)))


def _cifar_net(h: int = 32, w: int = 32) -> TorchPredictor:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * (h - 2) * (w - 2), 10)
    )
    return TorchPredictor(net, (3, h, w), 10)


@pytest.mark.parametrize("eps", [0.03, 0.3])
def test_read_ahead_redraws_equal_the_one_by_one_loop(
    zoo_predictor, mnist_subset, monkeypatch, eps
):
    mnist = mnist_subset(24)
    cifar = _cifar_net()
    x = torch.rand((12, 3, 32, 32), generator=torch.Generator().manual_seed(1))
    x[:, :, :16] = 0.0  # a black half: windows there often stay unchanged, so many redraws
    wide = _cifar_net(16, 24)  # not square: the two corners scale apart
    x_wide = torch.rand((8, 3, 16, 24), generator=torch.Generator().manual_seed(2))
    for predictor, images, labels in [
        (zoo_predictor, mnist.x, mnist.y), (cifar, x, cifar.predict(x)),
        (wide, x_wide, wide.predict(x_wide)),
    ]:  # fmt: skip
        results = []
        for batched in (False, True):
            monkeypatch.setattr(square, "BATCHED_REDRAWS", batched)
            attack = SquareLinf(queries=400, seed=2)
            results.append(attack(predictor, images, labels, eps))
        one, ahead = results
        assert torch.equal(one.x_adv, ahead.x_adv) and torch.equal(one.steps, ahead.steps)
