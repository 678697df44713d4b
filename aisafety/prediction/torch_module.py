"""Predictor for a PyTorch ``nn.Module``: gradients and activations included."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence

import torch
from torch import nn

from aisafety.errors import ConfigError
from aisafety.interfaces import Capability, mean_problem
from aisafety.prediction.base import Predictor
from aisafety.prediction.own_normalisation import normalised_twice


class Normalize(nn.Module):
    """Per-channel (x - mean) / std, so attacks work in the [0, 1] pixel scale.

    In ``dtype``, the network's own: inputs (float32 by the platform's convention) are cast
    to it, so a float64 or half-precision network gets inputs of its own dtype."""

    def __init__(
        self, mean: Sequence[float], std: Sequence[float], dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        check_normalisation(mean, std)
        self.register_buffer("mean", torch.tensor(mean, dtype=dtype).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=dtype).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(self.mean.dtype) - self.mean) / self.std


def check_normalisation(mean: Sequence[float], std: Sequence[float]) -> None:
    """A std of 0, or a mean in 0..255 units over [0, 1] pixels, refused where a predictor
    is built: the plan's and ``evaluate(mean=...)``'s check did not cover a predictor made
    in Python, whose accuracy then sat at chance without a word."""
    if any(s <= 0 for s in std):
        raise ConfigError(f"normalisation std must be > 0, got {tuple(std)}")
    if problem := mean_problem(mean, std, plan=False):
        raise ConfigError(f"normalisation: {problem}")


def weight_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of the module's first floating parameter or buffer (float32 without any):
    the dtype its layers compute in."""
    tensors = [*module.parameters(), *module.buffers()]
    return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)


HALF = (torch.float16, torch.bfloat16)


class TorchPredictor(Predictor):
    """Wraps a module (in eval mode) with its normalisation and input shape."""

    def __init__(
        self,
        module: nn.Module,
        input_shape: Sequence[int],
        num_classes: int,
        *,
        name: str = "torch-model",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        device: str | torch.device = "cpu",
    ):
        self.name = name
        self.input_shape = tuple(int(s) for s in input_shape)  # type: ignore[assignment]
        if len(self.input_shape) != 3:
            raise ConfigError(f"input_shape is (C, H, W), got {tuple(input_shape)}")
        self.num_classes = int(num_classes)
        self.device = torch.device(device)
        channels = self.input_shape[0]
        dtype = weight_dtype(module)
        norm = Normalize(mean or [0.0] * channels, std or [1.0] * channels, dtype)
        self.module = module
        self.normalised_twice = normalised_twice(module, mean, std)
        self.network = nn.Sequential(norm, module).to(self.device).eval()
        for p in self.network.parameters():
            p.requires_grad_(False)
        self.capabilities = frozenset(
            {Capability.LABELS, Capability.SCORES, Capability.GRADIENTS, Capability.ACTIVATIONS}
        )

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.network(x.to(self.device))
        # half-precision scores would round every margin a metric reads; float64 ones stay
        return scores.float() if scores.dtype in HALF else scores

    def layer_names(self) -> list[str]:
        """Leaf modules that compute something (ReLUs, convs, linears ...), in call order."""
        return [n for n, m in self.module.named_modules() if n and not list(m.children())]

    def features(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        """Outputs of ``layers`` for ``x``, collected with forward hooks in one pass."""
        modules = dict(self.module.named_modules())
        missing = [layer for layer in layers if layer not in modules]
        if missing:
            raise ConfigError(
                f"model {self.name!r} has no layer(s) {missing}; layers: {self.layer_names()}"
            )
        captured: dict[str, torch.Tensor] = {}

        def hook_for(layer: str):
            def hook(_module, _inputs, output):
                captured[layer] = output

            return hook

        handles = [modules[layer].register_forward_hook(hook_for(layer)) for layer in layers]
        try:
            self.logits(x)
        finally:
            for handle in handles:
                handle.remove()
        silent = [layer for layer in layers if layer not in captured]
        if silent:  # a KeyError later, in the metric
            raise ConfigError(
                f"model {self.name!r}: layer(s) {silent} never ran in a forward pass (their "
                "parent uses their weights directly, as nn.MultiheadAttention does with "
                "out_proj), so they have no outputs; choose other layers (the metric's "
                "'layers')"
            )
        return {
            layer: layer_output(self.name, layer, modules[layer], captured[layer])
            for layer in layers
        }


def layer_output(model: str, layer: str, module: nn.Module, output: object) -> torch.Tensor:
    """A watched layer's output as one tensor. ``nn.MultiheadAttention`` returns (attention
    output, attention weights or None): its output is element 0, what the next layer reads
    (a tuple reached the metrics' tensor code as ``'tuple' object has no attribute 'shape'``).
    Any other layer that returns something else is refused by name."""
    if isinstance(output, torch.Tensor):
        return output
    if issubclass(layer_type(module), nn.MultiheadAttention) and isinstance(output, tuple):
        return output[0]
    kinds = (
        ", ".join(type(o).__name__ for o in output)
        if isinstance(output, tuple | list)
        else type(output).__name__
    )
    raise ConfigError(
        f"model {model!r}: layer {layer!r} ({layer_type(module).__name__}) returns "
        f"{type(output).__name__} ({kinds}), not one tensor, so it has no neuron values; "
        "choose layers that return one tensor (the metric's 'layers'), e.g. the submodule "
        "whose output you mean"
    )


def layer_type(module: nn.Module) -> type:
    """The class a layer was written as: a ``torch.export`` program's rebuilt layers are
    ``InterpreterModule``s that carry it as ``original_type`` (prediction/exported.py)."""
    return getattr(module, "original_type", None) or type(module)


def module_fingerprint(module: nn.Module, label: str = "") -> str:
    """sha256 of what a module computes: its class and the code of the file defining it,
    and every parameter and buffer (name, dtype, shape, values). Two runs share stored
    results only when code and weights are the same."""
    digest = hashlib.sha256(
        f"{label}|{type(module).__module__}.{type(module).__qualname__}".encode()
    )
    files = {_source_file(type(m)) for m in module.modules()} - {None}
    for path in sorted(files):  # the user's code; torch's own is the installed version
        digest.update(_read(path))
    for key, tensor in module.state_dict().items():
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(
            tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        )
    return digest.hexdigest()


def _source_file(cls: type) -> str | None:
    """The file defining ``cls``; None for torch's own layers and generated classes."""
    if cls.__module__.split(".")[0] == "torch":
        return None
    try:
        return inspect.getsourcefile(cls)
    except TypeError:
        return None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return b""
