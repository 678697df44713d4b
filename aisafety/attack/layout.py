"""A channels-last copy of the network for the model passes of an attack's search.

oneDNN's convolutions run faster on channels-last (NHWC) tensors than on PyTorch's default
NCHW, most of all in bf16 (the rule and its measurements: ``precision.search_layout``). The
layout changes where the values lie in memory, not what they are, but the convolutions then
sum in another order: the logits move by rounding (about 1e-8 in fp32), so it is used only
where the search already runs in a reduced precision, whose rounding the final fp32 check
of the base class puts right.

The view runs a channels-last *copy* of the network: the predictor's own network keeps its
layout, so the clean logits, the final check, ``features()``, verifiers and everything else
see it as before. The copy costs the weights' memory once more while a chunk is attacked,
which the attack's memory budget counts (``copy_bytes``). Before it is used, it must
reproduce the fp32 clean logits of one image: a model whose code depends on the layout
(``.view`` on an activation raises on channels-last strides) or that gives other values
there keeps the default layout (``channels_last_view`` returns the predictor itself).
"""

from __future__ import annotations

import copy
import pickle

import torch
from torch import nn

from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor, layer_type
from aisafety.prediction.view import PredictorView

# fp32 logits of the copy against the predictor's: another summation order moves them by a
# few ulps; a layout-dependent model would be off by far more
RTOL = 1e-4


def convolutional(predictor: Predictor) -> bool:
    """Whether ``predictor`` is a plain PyTorch network (its logits are ``network(x)``)
    with a 2-D convolution, the only layer channels-last speeds up."""
    if type(predictor)._logits is not TorchPredictor._logits:  # wrappers, exported, ONNX RT
        return False
    network = getattr(predictor, "network", None)
    return isinstance(network, nn.Module) and any(
        issubclass(layer_type(m), nn.Conv2d) for m in network.modules()
    )


def copy_bytes(predictor: Predictor) -> int:
    """Bytes of the channels-last copy ``channels_last_view`` would make of ``predictor``'s
    network (its weights and buffers; 0 where it makes none)."""
    if not convolutional(predictor):
        return 0
    network = predictor.network  # type: ignore[attr-defined]
    return sum(t.numel() * t.element_size() for t in (*network.parameters(), *network.buffers()))


class ChannelsLast(PredictorView):
    """``inner`` with its forward passes run by ``network`` (a channels-last copy of
    ``inner.network``) on channels-last inputs; gradients reach the caller's NCHW input.
    ``features`` stay the user's network's, in its own layout."""

    def __init__(self, inner: TorchPredictor, network: nn.Module):
        super().__init__(inner)
        self.channels_last_network = network

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device).contiguous(memory_format=torch.channels_last)
        return self.channels_last_network(x)


def channels_last_view(predictor: Predictor, x: torch.Tensor, logits: torch.Tensor) -> Predictor:
    """A ``ChannelsLast`` view of ``predictor`` whose copy gives ``logits`` (the fp32 logits
    of ``predictor`` on ``x``, one image is enough) within rounding; else ``predictor``."""
    if not convolutional(predictor):
        return predictor
    try:
        network = copy.deepcopy(predictor.network).to(memory_format=torch.channels_last)
    except (TypeError, RuntimeError, copy.Error, pickle.PicklingError):  # not copyable
        return predictor
    view = ChannelsLast(predictor, network)  # type: ignore[arg-type]
    try:
        with torch.no_grad(), torch.autocast(predictor.device.type, enabled=False):
            got = view._logits(x).float()
    except (RuntimeError, ValueError, TypeError, IndexError):  # layout-dependent code
        return predictor
    scale = float(logits.abs().max().clamp_min(1.0))
    same = got.shape == logits.shape and torch.allclose(got, logits, rtol=RTOL, atol=RTOL * scale)
    return view if same else predictor
