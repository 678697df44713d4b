"""Neuron outputs and their training-data bounds, computed once and shared by the metrics.

A *neuron* follows DeepGauge (Ma et al. 2018): a unit of a fully connected layer as is, a
channel of a convolutional layer reduced to its spatial mean; on a token sequence (N, T, D) of a
linear, norm or transformer layer, a hidden unit reduced to its mean over the tokens
(neuron_layout.py). Bounds (per-neuron min and max)
come from the *profile* data (by default the training split of the evaluated dataset), because
coverage asks whether the tested inputs reach the ranges the model saw in training.

Everything here works on whole layers at once: one forward pass per batch gives every layer's
output (forward hooks), and every statistic is a tensor operation over all neurons.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError
from aisafety.evaluation.neuron_layout import ACTIVATION_TYPES, channels_last
from aisafety.memory_budget import fitting
from aisafety.prediction.base import Predictor
from aisafety.prediction.footprint import activations_bytes, image_bytes
from aisafety.prediction.torch_module import layer_type

WEIGHT_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def torch_module(predictor: Predictor) -> nn.Module | None:
    """The ``nn.Module`` behind a predictor, looking through input-defense wrappers."""
    while not hasattr(predictor, "module") and hasattr(predictor, "inner"):
        predictor = predictor.inner  # type: ignore[attr-defined]
    module = getattr(predictor, "module", None)
    return module if isinstance(module, nn.Module) else None


def default_layers(predictor: Predictor) -> tuple[str, ...]:
    """The activation modules (ReLU, ...) in call order; without any, the conv/linear layers
    except the last one (the logits are outputs, not hidden neurons)."""
    module = torch_module(predictor)
    if module is None:
        raise ConfigError(
            f"model {predictor.name!r} does not expose its modules, so the hidden layers "
            f"cannot be chosen for it; set the metric's 'layers' to some of "
            f"{predictor.layer_names()}"
        )
    unrun = _unrun_leaves(module)
    leaves = [
        (n, m) for n, m in module.named_modules() if n and not list(m.children()) and n not in unrun
    ]
    layers = [n for n, m in leaves if issubclass(layer_type(m), ACTIVATION_TYPES)]
    if not layers:
        layers = [n for n, m in leaves if issubclass(layer_type(m), WEIGHT_TYPES)][:-1]
    if not layers:
        raise ConfigError(
            f"model {predictor.name!r} has no activation, convolution or hidden linear layer; "
            f"set the metric's 'layers' to some of {predictor.layer_names()}"
        )
    return tuple(layers)


def _unrun_leaves(module: nn.Module) -> set[str]:
    """Layers whose forward never runs: ``nn.MultiheadAttention`` reads its ``out_proj``'s
    weights in a functional call, so a hook there never fired and coverage failed with
    KeyError 'block.self_attn.out_proj' on a transformer."""
    return {
        f"{name}.{child}" if name else child
        for name, m in module.named_modules()
        if issubclass(layer_type(m), nn.MultiheadAttention)
        for child, _ in m.named_children()
    }


def neuron_values(output: torch.Tensor, last: bool = False) -> torch.Tensor:
    """(N, C, *spatial) -> (N, C) by spatial mean (DeepGauge's conv neurons); (N, D) as is;
    with ``last`` (a channels-last layer), (N, *tokens, D) -> (N, D) by the mean over tokens."""
    output = _channels_first(output, last)
    if output.dim() <= 2:
        return output.reshape(output.shape[0], -1)
    return output.flatten(2).mean(2)


def _channels_first(output: torch.Tensor, last: bool) -> torch.Tensor:
    return output.movedim(-1, 1) if last and output.dim() > 2 else output


def neuron_layouts(
    predictor: Predictor, x: torch.Tensor, layers: Sequence[str]
) -> tuple[bool, ...]:
    """Per layer, whether its neurons are the last dimension (``neuron_layout.channels_last``;
    one forward pass of ``x[:1]`` where an element-wise layer is watched)."""
    with torch.inference_mode():
        return channels_last(
            torch_module(predictor), layers, lambda: predictor.logits(x[:1].to(predictor.device))
        )


def batch_first(name: str, output: torch.Tensor, n: int) -> torch.Tensor:
    """``output`` of layer ``name`` for ``n`` images, refused where its dim 0 is not the batch:
    a sequence-first transformer (``batch_first=False``) puts the tokens there, and read as
    the batch, its tokens and images would mix without an error."""
    if output.shape[0] != n:
        raise ConfigError(
            f"layer {name!r}: output of shape {tuple(output.shape)} for {n} images does not "
            "start with the batch (a sequence-first transformer, batch_first=False?); choose "
            "layers whose output is batch-first (the metric's 'layers')"
        )
    return output


@dataclass(frozen=True)
class NeuronBounds:
    """Per-neuron range seen on the profile data; neurons of all layers side by side."""

    layers: tuple[str, ...]
    sizes: tuple[int, ...]  # neurons per layer, in ``layers`` order
    low: torch.Tensor  # (N,)
    high: torch.Tensor  # (N,)
    n_profile: int

    @property
    def n_neurons(self) -> int:
        return int(self.low.numel())

    @classmethod
    def from_outputs(cls, layers, sizes, outputs: torch.Tensor) -> NeuronBounds:
        low, high = torch.aminmax(outputs, dim=0)
        return cls(tuple(layers), tuple(sizes), low, high, int(outputs.shape[0]))


def _batches(n: int, batch_size: int) -> list[slice]:
    return [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def _fitting_batch(predictor: Predictor, batch_size: int, copies: int) -> int:
    """``batch_size``, or fewer images per pass where their forward passes and the layer
    outputs the hooks hold (``copies`` inputs per image) would not fit the memory budget;
    the values do not depend on it. Refused before any work where one image does not fit."""
    one = copies * (image_bytes(predictor, grad=False) + activations_bytes(predictor))
    return fitting(
        f"the neuron outputs of model {predictor.name!r} (one image of shape "
        f"{tuple(predictor.input_shape)}, every layer's output kept)",
        one,
        batch_size,
        "watch fewer layers (the metric's 'layers'), or raise 'limits: {memory_gib: ...}' "
        "in the plan if the machine has the memory",
        predictor.device,
    )


def neuron_outputs(
    predictor: Predictor,
    x: torch.Tensor,
    layers: Sequence[str],
    batch_size: int,
    layouts: tuple[bool, ...] | None = None,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(n, N) neuron values of ``layers`` for ``x`` (one forward pass) and neurons per layer;
    ``layouts``: ``neuron_layouts`` of ``layers`` if known (else computed here)."""
    parts: list[torch.Tensor] = []
    batch_size = _fitting_batch(predictor, batch_size, copies=1)
    layouts = neuron_layouts(predictor, x, layers) if layouts is None else layouts
    with torch.inference_mode():
        for b in _batches(len(x), batch_size):
            features = predictor.features(x[b].to(predictor.device), layers)
            values = [
                neuron_values(batch_first(name, features[name], len(x[b])), last)
                for name, last in zip(layers, layouts, strict=True)
            ]
            parts.append(torch.cat(values, 1).cpu())
    return torch.cat(parts), tuple(v.shape[1] for v in values)


def neuron_deviation(
    predictor: Predictor,
    x: torch.Tensor,
    x_other: torch.Tensor,
    layers: Sequence[str],
    batch_size: int,
    layouts: tuple[bool, ...] | None = None,
) -> list[torch.Tensor]:
    """Per layer, the (n, C) mean absolute difference of each neuron's output map between
    ``x`` and ``x_other``: ||f_{l,m}(x) - f_{l,m}(x')||_1 / dim(f_{l,m}(x)) (AISafety eq. 22).
    A neuron of a channels-last layer is a hidden unit, its map the unit over the tokens.

    Both inputs go through one forward pass per batch; the full maps are never stored.
    ``layouts`` as in ``neuron_outputs``.
    """
    parts: list[list[torch.Tensor]] = [[] for _ in layers]
    batch_size = _fitting_batch(predictor, batch_size, copies=2)
    layouts = neuron_layouts(predictor, x, layers) if layouts is None else layouts
    with torch.inference_mode():
        for b in _batches(len(x), batch_size):
            pair = torch.cat([x[b], x_other[b]]).to(predictor.device)
            features = predictor.features(pair, layers)
            for i, (name, last) in enumerate(zip(layers, layouts, strict=True)):
                output = _channels_first(batch_first(name, features[name], len(pair)), last)
                clean, other = output.chunk(2)
                diff = (clean - other).abs().reshape(clean.shape[0], clean.shape[1], -1)
                parts[i].append(diff.mean(2).cpu())
    return [torch.cat(p) for p in parts]


class NeuronArtifacts:
    """The evaluation context's cache of neuron outputs, bounds and deviations.

    ``load_profile`` is called only when a metric first needs bounds: plans without coverage
    metrics never read the training data. The layers' layouts are found once per layer set
    (before session 19 their one-image forward pass ran for the profile data and again for
    each tested set); kept here, they live as long as the run's context and its predictor, so
    they neither keep a model alive nor outlast a change to it (a module-level cache would).
    """

    def __init__(
        self,
        predictor: Predictor,
        batch_size: int,
        load_profile: Callable[[], LoadedDataset] | None = None,
    ):
        self.predictor = predictor
        self.batch_size = batch_size
        self.load_profile = load_profile
        self._cache: dict[Hashable, Any] = {}
        self._sizes: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._layouts: dict[tuple[str, ...], tuple[bool, ...]] = {}
        self.passes: dict[str, int] = {"outputs": 0, "deviation": 0, "bounds": 0}

    def _memo(self, key: Hashable, kind: str, compute: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
            self.passes[kind] += 1
        return self._cache[key]

    def layers(self, requested: Sequence[str] | None) -> tuple[str, ...]:
        return tuple(requested) if requested else default_layers(self.predictor)

    def layouts(self, layers: tuple[str, ...], x: torch.Tensor) -> tuple[bool, ...]:
        """``neuron_layouts`` of ``layers``, found with ``x``'s first image on first use."""
        if layers not in self._layouts:
            self._layouts[layers] = neuron_layouts(self.predictor, x, layers)
        return self._layouts[layers]

    def bounds(self, layers: tuple[str, ...]) -> NeuronBounds:
        """Per-neuron [low, high] over the profile data (computed once per layer set)."""

        def compute() -> NeuronBounds:
            if self.load_profile is None:
                raise ConfigError(
                    "neuron coverage needs profile data for the neuron bounds; set the plan's "
                    "'profile_dataset' (default: the train split of the evaluated dataset)"
                )
            try:
                profile = self.load_profile()
            except ConfigError as exc:
                raise ConfigError(
                    f"could not load the profile data for the neuron bounds: {exc}; set the "
                    "plan's 'profile_dataset' to data the model was trained on (its train split)"
                ) from None
            layouts = self.layouts(layers, profile.x)
            outputs, sizes = neuron_outputs(
                self.predictor, profile.x, layers, self.batch_size, layouts
            )
            self._sizes[layers] = sizes
            return NeuronBounds.from_outputs(layers, sizes, outputs)

        return self._memo(("bounds", layers), "bounds", compute)

    def outputs(self, layers: tuple[str, ...], key: Hashable, x: torch.Tensor) -> torch.Tensor:
        """(n, N) neuron values of the inputs known as ``key`` (e.g. 'clean', an attack run)."""

        def compute() -> torch.Tensor:
            layouts = self.layouts(layers, x)
            values, self._sizes[layers] = neuron_outputs(
                self.predictor, x, layers, self.batch_size, layouts
            )
            return values

        return self._memo(("outputs", layers, key), "outputs", compute)

    def sizes(self, layers: tuple[str, ...]) -> tuple[int, ...]:
        """Neurons per layer; known once outputs or bounds of ``layers`` were computed."""
        return self._sizes[layers]

    def deviation(
        self, layers: tuple[str, ...], key: Hashable, x: torch.Tensor, x_other: torch.Tensor
    ) -> list[torch.Tensor]:
        return self._memo(
            ("deviation", layers, key),
            "deviation",
            lambda: neuron_deviation(
                self.predictor, x, x_other, layers, self.batch_size, self.layouts(layers, x)
            ),
        )
