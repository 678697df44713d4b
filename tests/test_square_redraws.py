"""Square's redraws read ahead in each sample's stream on the host (the CPU's path) or
gathered all at once on the device (the GPU's, ``square_draws.py``) give exactly the numbers
of the reference's one-by-one loop: same adversarial images, same query counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import aisafety.attack.square as square
from aisafety.attack.score_search import LaggedCopy
from aisafety.attack.square import SquareLinf
from aisafety.attack.square_draws import DeviceDraws
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


def _cases(mnist):
    cifar = _cifar_net()
    x = torch.rand((12, 3, 32, 32), generator=torch.Generator().manual_seed(1))
    x[:, :, :16] = 0.0  # a black half: windows there often stay unchanged, so many redraws
    wide = _cifar_net(16, 24)  # not square: the two corners scale apart
    x_wide = torch.rand((8, 3, 16, 24), generator=torch.Generator().manual_seed(2))
    return [
        (cifar, x, cifar.predict(x)), (wide, x_wide, wide.predict(x_wide)), mnist,
    ]  # fmt: skip


def _results(monkeypatch, modes, predictor, images, labels, eps, **config):
    results = []
    for mode in modes:
        monkeypatch.setattr(square, "REDRAWS", mode)
        results.append(SquareLinf(seed=2, **config)(predictor, images, labels, eps))
    return results


@pytest.mark.parametrize("eps", [0.03, 0.3])
def test_read_ahead_and_device_redraws_equal_the_one_by_one_loop(
    zoo_predictor, mnist_subset, monkeypatch, eps
):
    mnist = mnist_subset(24)
    for predictor, images, labels in _cases((zoo_predictor, mnist.x, mnist.y)):
        one, *others = _results(
            monkeypatch, ["loop", "host", "device"], predictor, images, labels, eps, queries=400
        )
        for other in others:
            assert torch.equal(one.x_adv, other.x_adv) and torch.equal(one.steps, other.steps)


class _Late(LaggedCopy):
    """A CPU copy that arrives ``delay`` pushes late, as a GPU's may (or later)."""

    delay = 6

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__(value)
        self.queue: list[np.ndarray] = []

    def push(self, value: torch.Tensor) -> None:
        self.pushed += 1
        self.queue.append(value.numpy().copy())

    def latest(self) -> np.ndarray:
        while len(self.queue) > self.delay:
            self.wait_one()
        return self.host

    def wait_one(self) -> None:
        if self.queue:
            self.host, self.arrived = self.queue.pop(0), self.arrived + 1


class _TightLateDraws(DeviceDraws):
    """Device draws in a ring of two buffers whose positions reach the host late: slots are
    refilled late and the host often has to wait (the fallback)."""

    waits = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "slots": 2})
        self.seen = _Late(self.position)

    def prepare(self, rows: np.ndarray) -> None:
        super().prepare(rows)
        _TightLateDraws.waits += len(self.seen.queue) < min(self.seen.pushed, _Late.delay)


@pytest.mark.parametrize(("max_resamples", "delay"), [(100, 6), (3, 60)])
def test_device_draws_stay_exact_when_positions_arrive_late(
    zoo_predictor, mnist_subset, monkeypatch, max_resamples, delay
):
    """Across many buffer ends (400 queries of 5 numbers and up to 99 x 3 more against
    buffers of 1,024) with the positions ``delay`` queries late in a ring of two buffers,
    the device's draws are the host's: late refills and waits for positions change nothing."""
    monkeypatch.setattr(square, "DeviceDraws", _TightLateDraws)
    monkeypatch.setattr(_Late, "delay", delay)
    _TightLateDraws.waits = 0
    mnist = mnist_subset(16)
    most = 0
    for predictor, images, labels in _cases((zoo_predictor, mnist.x, mnist.y)):
        host, device = _results(
            monkeypatch, ["host", "device"], predictor, images, labels, 0.01, queries=400,
            max_resamples=max_resamples,
        )  # fmt: skip
        assert torch.equal(host.x_adv, device.x_adv) and torch.equal(host.steps, device.steps)
        most = max(most, int(host.steps.max()))
    assert most > 2 * BUFFER // (3 + 3)  # some samples crossed buffer ends twice or more
    assert _TightLateDraws.waits > 0  # the fallback ran


def test_device_draws_serve_the_streams_numbers():
    """The first draws and redraws gathered on the device are what ``uniforms_on_host``
    serves one after the other, across the end of a buffer."""
    streams, reference = SampleStreams(3, torch.arange(5)), SampleStreams(3, torch.arange(5))
    streams.uniforms_on_host(7), reference.uniforms_on_host(7)  # both buffers part-used
    redraws = BUFFER // 3  # the most the closed form serves (across one buffer end)
    draws = DeviceDraws(streams, 5, 3, redraws, torch.device("cpu"))
    rows = torch.tensor([0, 2, 4])
    u = draws.draw(rows)
    view = reference[rows]
    assert torch.equal(u[:, :5], torch.from_numpy(view.uniforms_on_host(5)))
    for j in range(redraws):  # 7 + 5 + 341 x 3 numbers: past the end of the first buffer
        assert torch.equal(u[:, 5 + 3 * j : 8 + 3 * j], torch.from_numpy(view.uniforms_on_host(3)))
    draws.advance(rows, torch.tensor([0, redraws, 17]))
    # past the first draw and the redraws used: row 2's first 337 fit in the rest of its
    # buffer, whose last number is skipped, 4 in the next; rows 1 and 3 were not drawn for
    assert draws.position.tolist() == [12, 7, BUFFER + 4 * 3, 7, 12 + 17 * 3]
    assert not DeviceDraws.serves(5, 3, redraws + 1)  # Square then redraws on the host


def test_the_memory_estimate_counts_the_ring_the_device_path_keeps(monkeypatch):
    """On the device path each sample keeps a ring of draws there and its two signed images:
    the estimate per image grows by exactly their bytes, and by nothing where redraws stay
    on the host."""
    predictor, attack = _cifar_net(), SquareLinf(seed=2)
    monkeypatch.setattr(square, "REDRAWS", "host")
    on_host = attack.image_memory(predictor)
    monkeypatch.setattr(square, "REDRAWS", "device")
    streams = SampleStreams(3, torch.arange(4))
    redraws = attack.config.max_resamples - 1
    ring = DeviceDraws(streams, 2 + 3, 3, redraws, torch.device("cpu")).ring
    signed = 2 * 3 * 32 * 32 * 4  # x + eps and x - eps, float32
    grown = attack.image_memory(predictor) - on_host
    assert grown == ring.numel() * ring.element_size() // 4 + signed


def test_the_device_draws_table_is_made_once_and_changes_no_result(monkeypatch):
    """The device path's offset table (``DeviceDraws.offsets``, 3.3 MB for 3 channels) is
    kept per (draw sizes, device): two calls of Square make it once, and both give what the
    host path gives, bit for bit; the kept table is a fresh one's values."""
    predictor = _cifar_net()
    x = torch.rand((6, 3, 32, 32), generator=torch.Generator().manual_seed(3))
    x[:, :, :16] = 0.0  # many redraws, as in _cases
    made, fresh = [], DeviceDraws.offsets
    monkeypatch.setattr(
        DeviceDraws, "offsets", staticmethod(lambda *a: made.append(a) or fresh(*a))
    )
    DeviceDraws.table_on.cache_clear()
    host, first, second = _results(
        monkeypatch, ["host", "device", "device"], predictor, x, predictor.predict(x), 0.05,
        queries=60,
    )  # fmt: skip
    assert made == [(5, 3, 99)]
    for device in (first, second):
        assert torch.equal(host.x_adv, device.x_adv) and torch.equal(host.steps, device.steps)
    assert torch.equal(DeviceDraws.table_on(5, 3, 99, torch.device("cpu")), fresh(5, 3, 99))
