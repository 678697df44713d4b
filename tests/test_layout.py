"""The channels-last search layout: chosen by rule (bf16 on the CPU, convolutional nets), run
on a checked copy of the network, never on the user's own, and left out where the copy does
not reproduce the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import aisafety.attack.precision as precision
from aisafety.attack.base import RESULT_COPIES
from aisafety.attack.layout import ChannelsLast, channels_last_view, convolutional
from aisafety.attack.pgd import PGDLinf
from aisafety.attack.precision import ReducedPrecision, search_layout
from aisafety.database.zoo import load_zoo_model
from aisafety.errors import MemoryBudgetError
from aisafety.memory_budget import memory_limit
from aisafety.prediction.torch_module import TorchPredictor

CPU = torch.device("cpu")


def test_the_rule_is_channels_last_for_bf16_on_the_cpu_only():
    assert search_layout(CPU, torch.bfloat16) is torch.channels_last
    assert search_layout(CPU, None) is torch.contiguous_format  # fp32: bit for bit as before
    assert search_layout(CPU, torch.float16) is torch.contiguous_format
    cuda = torch.device("cuda")  # a device object only: the rule reads its type
    assert search_layout(cuda, torch.bfloat16) is torch.contiguous_format


def probe(model: TorchPredictor, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand((n, *model.input_shape), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return x, model.logits(x)


def test_the_view_reproduces_the_model_on_a_copy_and_leaves_the_model_alone():
    model = load_zoo_model("mnist-cnn-pgd-at")
    x, logits = probe(model)
    view = channels_last_view(model, x[:1], logits[:1])
    assert isinstance(view, ChannelsLast)
    conv = view.channels_last_network[1][3]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous() and model.network[1][3].weight.is_contiguous()
    xg = x.clone().requires_grad_(True)
    got = view._logits(xg)
    torch.testing.assert_close(got, logits, rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad(got.sum(), xg)
    xr = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(model._logits(xr).sum(), xr)
    assert grad.shape == x.shape and grad.is_contiguous()  # the caller's layout
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)
    assert view.network is model.network and view.name == model.name
    assert set(view.features(x, ["4"])) == {"4"}


class Reshaped(nn.Module):
    """Flattens with ``.view``, which raises on channels-last strides."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return self.head(out.view(out.shape[0], -1))


class LayoutDependent(nn.Module):
    """Gives other values in channels-last (reads the strides): a copy must not be trusted."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x).mean((2, 3))
        return self.head(out) + float(x.is_contiguous())


def small(module: nn.Module) -> TorchPredictor:
    torch.manual_seed(0)
    return TorchPredictor(module, (3, 8, 8), 10, name=type(module).__name__)


@pytest.mark.parametrize("module", [Reshaped, LayoutDependent])
def test_a_model_the_copy_does_not_reproduce_keeps_its_layout(module):
    model = small(module())
    assert convolutional(model)
    assert channels_last_view(model, *probe(model, 1)) is model


def test_wrong_probe_logits_keep_the_layout():
    model = load_zoo_model("mnist-cnn-pgd-at")
    x, logits = probe(model, 1)
    assert channels_last_view(model, x, logits + 1.0) is model


def test_only_plain_convolutional_networks_qualify():
    mlp = TorchPredictor(nn.Sequential(nn.Flatten(), nn.Linear(3, 2)), (3, 1, 1), 2)
    assert not convolutional(mlp)
    assert channels_last_view(mlp, *probe(mlp, 1)) is mlp

    class Clipped(TorchPredictor):  # its own _logits: a copy of .network would bypass it
        def _logits(self, x: torch.Tensor) -> torch.Tensor:
            return super()._logits(x).clamp(-5, 5)

    model = load_zoo_model("mnist-cnn-pgd-at")
    clipped = Clipped(model.module, model.input_shape, 10, mean=[0.1307], std=[0.3081])
    assert not convolutional(clipped)
    assert channels_last_view(clipped, *probe(clipped, 1)) is clipped


def test_auto_on_an_avx512_bf16_cpu_searches_in_bf16_channels_last(monkeypatch, mnist_subset):
    """The selection from the CPU's flags down (a mocked capability), to the model passes."""
    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx512_bf16": True})
    model, data = load_zoo_model("mnist-cnn-pgd-at"), mnist_subset(8)
    seen: list[tuple[bool, bool]] = []
    conv = model.network[1][3]
    conv.register_forward_pre_hook(
        lambda module, inputs: seen.append(
            (torch.is_autocast_enabled("cpu"), not inputs[0].is_contiguous())
        )
    )
    result = PGDLinf(steps=2, precision="auto")(model, data.x, data.y, 0.3)
    assert seen[-3:] == [(True, True), (True, True), (False, False)]  # two steps, the check
    searcher = PGDLinf(precision="auto").search_predictor(model, probe(model, 1))
    assert isinstance(searcher, ReducedPrecision) and isinstance(searcher.inner, ChannelsLast)
    with torch.no_grad():
        assert torch.equal(result.success, model.logits(result.x_adv).argmax(1) != data.y)


def test_without_fast_bf16_auto_keeps_the_default_layout(monkeypatch):
    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx2": True})
    model = load_zoo_model("mnist-cnn-pgd-at")
    assert PGDLinf(precision="auto").search_predictor(model, probe(model, 1)) is model


def test_the_copy_is_counted_in_the_attacks_memory_budget(monkeypatch):
    """The channels-last copy holds the network's weights once more while a chunk is
    attacked; until session 20 no budget counted it (a WRN-28-10: 139 MiB over the budget).
    A budget that fits one image and the result's copies but not the copy beside them now
    refuses before any work; one byte more runs."""
    monkeypatch.setattr(precision, "fast_precisions", lambda device: ("bf16",))
    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                            nn.Linear(8 * 8 * 8, 10))  # fmt: skip
    model = TorchPredictor(network, (3, 8, 8), 10)
    weights = sum(t.nbytes for t in model.network.state_dict().values())  # mean, std too
    attack = PGDLinf({"steps": 1, "precision": "bf16"})
    assert attack.search_copy_bytes(model) == weights
    assert PGDLinf({"steps": 1}).search_copy_bytes(model) == 0  # fp32 runs the model itself
    x, y = torch.rand(1, 3, 8, 8), torch.tensor([3])
    needed = RESULT_COPIES * x.nbytes + attack.image_memory(model) + weights
    with memory_limit(needed - 1), pytest.raises(MemoryBudgetError, match="attack 'pgd-linf'"):
        attack(model, x, y, 0.03)
    with memory_limit(needed):
        assert attack(model, x, y, 0.03).x_adv.shape == x.shape
