"""Feature vectors for the attack-independent metrics (RDI, ROBY): one forward pass, batched.

The default layer is the one feeding the classifier head: the *input* of the model's last
``nn.Linear`` (a forward pre-hook), i.e. the penultimate representation, wherever the model
puts its flatten or pooling. ``layer`` names another module (its output is used, flattened)
or ``"logits"`` (the K class scores the RDI paper's Section 3.2 describes: "the dimensionality
of each feature vector equals the number of model classes").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from aisafety.errors import ConfigError
from aisafety.evaluation.neurons import batch_first, torch_module
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import layer_output, layer_type

HEAD_INPUT = "head-input"
LOGITS = "logits"


@dataclass(frozen=True)
class Features:
    """(n, d) feature vectors and the model's (n,) predicted labels on the same inputs."""

    vectors: torch.Tensor
    predicted: torch.Tensor


def _last_linear(predictor: Predictor) -> nn.Module:
    module = torch_module(predictor)
    linears = (
        [m for m in module.modules() if issubclass(layer_type(m), nn.Linear)] if module else []
    )
    if not linears:
        raise ConfigError(
            f"model {predictor.name!r} has no nn.Linear classifier head to read the features "
            f"feeding it; set the metric's 'layer' to one of {predictor.layer_names()} or "
            f"to 'logits'"
        )
    return linears[-1]


def _hooked_module(predictor: Predictor, layer: str) -> nn.Module:
    module = torch_module(predictor)
    modules = dict(module.named_modules()) if module is not None else {}
    if layer not in modules or not layer:
        raise ConfigError(
            f"metric layer {layer!r}: model {predictor.name!r} has no such layer; use one of "
            f"{predictor.layer_names()}, {HEAD_INPUT!r} (the input of the last nn.Linear) or "
            f"{LOGITS!r}"
        )
    return modules[layer]


def _capture(predictor: Predictor, module: nn.Module, pre: bool, x: torch.Tensor):
    """The module's input (``pre``) or output during one forward pass, and the logits."""
    captured: list[torch.Tensor] = []
    if pre:
        handle = module.register_forward_pre_hook(lambda _m, inputs: captured.append(inputs[0]))
    else:
        handle = module.register_forward_hook(lambda _m, _i, output: captured.append(output))
    try:
        logits = predictor.logits(x)
    finally:
        handle.remove()
    return captured[-1], logits


def extract_features(
    predictor: Predictor, x: torch.Tensor, layer: str = HEAD_INPUT, batch_size: int = 500
) -> Features:
    """Feature vectors of ``x`` at ``layer`` and the predicted labels, in one pass per batch.

    A module called twice in one pass is read at its last call.
    """
    module = None
    if layer == HEAD_INPUT:
        module = _last_linear(predictor)
    elif layer != LOGITS:
        module = _hooked_module(predictor, layer)
    vectors, predicted = [], []
    with torch.inference_mode():
        for xb in x.split(batch_size):
            xb = xb.to(predictor.device)
            if module is None:
                feats = logits = predictor.logits(xb)
            else:
                feats, logits = _capture(predictor, module, layer == HEAD_INPUT, xb)
                if layer != HEAD_INPUT:  # an attention layer's (output, weights): output
                    feats = layer_output(predictor.name, layer, module, feats)
                feats = batch_first(layer, feats, len(xb))
            vectors.append(feats.flatten(1).double().cpu())
            predicted.append(logits.argmax(1).cpu())
    return Features(torch.cat(vectors), torch.cat(predicted))
