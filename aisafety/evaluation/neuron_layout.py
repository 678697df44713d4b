"""Which dimension of a layer's output holds its neurons: the channel (dim 1) or the last.

A convolution's output is channels-first, (N, C, *spatial), and DeepGauge's neuron is the
channel. ``nn.Linear``, ``nn.LayerNorm``, attention and transformer layers act on the *last*
dimension: on a token sequence (N, T, D) their neurons are the D hidden units, not the T
tokens (before session 18 a ViT's coverage was computed on the tokens, without an error).
The layout comes from the layer's type; an element-wise layer (ReLU, GELU, Dropout, ...)
keeps the layout of the nearest weight, norm or pooling layer registered before it.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def channels_last(module: nn.Module | None, layers: Sequence[str]) -> tuple[bool, ...]:
    """Per layer, whether its neurons are the last dimension of its output.

    Element-wise layers look back in registration order (a ViT's MLP registers Linear, GELU,
    Dropout, Linear in the order it calls them) past other element-wise layers; any other
    layer type, and a model without modules, reads channels-first (DeepGauge's layout); a
    name the model lacks too (``Predictor.features`` refuses it, naming the layers).
    """
    if module is None:
        return tuple(False for _ in layers)
    leaves = [(n, m) for n, m in module.named_modules() if n and not list(m.children())]
    index = {name: i for i, (name, _) in enumerate(leaves)}
    modules = dict(module.named_modules())
    return tuple(_last(modules.get(name), leaves[: index.get(name, 0)]) for name in layers)


def _last(layer: nn.Module | None, before: list[tuple[str, nn.Module]]) -> bool:
    kind = layer_type(layer) if layer is not None else nn.Module
    if issubclass(kind, ELEMENTWISE_TYPES):
        kinds = (layer_type(m) for _, m in reversed(before))
        kind = next((k for k in kinds if not issubclass(k, ELEMENTWISE_TYPES)), nn.Module)
    return issubclass(kind, CHANNELS_LAST_TYPES)
