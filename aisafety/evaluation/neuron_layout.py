"""Which dimension of a layer's output holds its neurons: the channel (dim 1) or the last.

A convolution's output is channels-first, (N, C, *spatial), and DeepGauge's neuron is the
channel. ``nn.Linear``, ``nn.LayerNorm``, attention and transformer layers act on the *last*
dimension: on a token sequence (N, T, D) their neurons are the D hidden units, not the T
tokens (before session 18 a ViT's coverage was computed on the tokens, without an error).
The layout comes from the layer's type; an element-wise layer (ReLU, GELU, Dropout, ...)
keeps the layout of the layer that ran just before it (call order, from one forward pass:
registration order would misread a CNN that registers its shared ReLU after its head).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from aisafety.prediction.torch_module import layer_type

# Outputs of these modules are what DeepGauge calls neuron outputs: after the non-linearity.
ACTIVATION_TYPES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softplus,
)  # fmt: skip
ELEMENTWISE_TYPES: tuple[type[nn.Module], ...] = (
    *ACTIVATION_TYPES, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.Identity,
)  # fmt: skip
CHANNELS_LAST_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Bilinear, nn.LayerNorm, nn.RMSNorm, nn.Embedding, nn.MultiheadAttention,
    nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder,
    nn.TransformerDecoder, nn.Transformer,
)  # fmt: skip


def channels_last(
    module: nn.Module | None, layers: Sequence[str], forward: Callable[[], object]
) -> tuple[bool, ...]:
    """Per layer, whether its neurons are the last dimension of its output.

    ``forward`` runs one forward pass (one image is enough), only where an element-wise layer
    is watched: such a layer takes the layout of the last other layer to finish before its
    last call (the producer of its input in a sequential flow). Any other layer type, a
    model without modules, and a name the model lacks (``Predictor.features`` refuses it)
    read channels-first (DeepGauge's layout).
    """
    if module is None:
        return tuple(False for _ in layers)
    modules = dict(module.named_modules())
    kinds = {name: layer_type(modules[name]) if name in modules else nn.Module for name in layers}
    if any(issubclass(kind, ELEMENTWISE_TYPES) for kind in kinds.values()):
        order = _call_order(module, forward)
        kinds = {name: _input_kind(name, kind, order) for name, kind in kinds.items()}
    return tuple(issubclass(kinds[name], CHANNELS_LAST_TYPES) for name in layers)


def _call_order(module: nn.Module, forward: Callable[[], object]) -> list[tuple[str, type]]:
    """(name, type) of every leaf and channels-last layer, in the order their calls end."""
    order: list[tuple[str, type]] = []
    watched = [
        (n, m)
        for n, m in module.named_modules()
        if n and (not list(m.children()) or issubclass(layer_type(m), CHANNELS_LAST_TYPES))
    ]
    handles = [
        m.register_forward_hook(lambda *_, n=n, k=layer_type(m): order.append((n, k)))
        for n, m in watched
    ]
    try:
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return order


def _input_kind(name: str, kind: type, order: list[tuple[str, type]]) -> type:
    """An element-wise layer's kind is that of the last non-element-wise layer before it."""
    if not issubclass(kind, ELEMENTWISE_TYPES):
        return kind
    calls = [i for i, (n, _) in enumerate(order) if n == name]
    before = order[: calls[-1]] if calls else []
    earlier = (k for _, k in reversed(before) if not issubclass(k, ELEMENTWISE_TYPES))
    return next(earlier, nn.Module)
