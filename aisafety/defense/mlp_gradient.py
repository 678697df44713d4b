"""The cross-entropy's input gradient of a plain ReLU MLP by hand, for PGD inside training.

PGD-100 adversarial training of the SoK's small FCNNs (2 x 20, 3 x 100) runs 101 forward and
backward passes per batch; on a network that small autograd's per-op bookkeeping costs
about twice the matrix products themselves (FCNNa, batch 256, one thread: 1.4 ms per pass
against 0.43 ms of bare products). For ``[Normalize] Flatten (Linear ReLU)* Linear`` the
gradient is a few products: d(sum CE)/d logits = softmax - onehot, then back through each
Linear (``g @ W``) and ReLU (``g * (z > 0)``, autograd's rule at z = 0 too), with the
normalisation folded into the first layer. Any other network returns None and PGD uses
autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aisafety.prediction.torch_module import Normalize


class ReluMlp:
    """A plain ReLU MLP's weights, the normalisation folded into the first layer; read from
    the network when built, so build one per attack (the weights then stay fixed)."""

    def __init__(self, normalize: Normalize | None, linears: list[nn.Linear]):
        with torch.no_grad():
            self.weights = [linear.weight.detach() for linear in linears]
            self.biases = [linear.bias.detach() for linear in linears]
            if normalize is not None:  # W (x - m) / s + b = (W / s) x + (b - (W / s) m)
                pixels = self.weights[0].shape[1]
                channels = normalize.mean.numel()
                scale = normalize.std.flatten().repeat_interleave(pixels // channels)
                shift = normalize.mean.flatten().repeat_interleave(pixels // channels)
                self.weights[0] = self.weights[0] / scale
                self.biases[0] = self.biases[0] - self.weights[0] @ shift

    @classmethod
    def of(cls, network: nn.Module) -> ReluMlp | None:
        """The MLP view of ``network`` (nested ``nn.Sequential`` flattened), or None."""
        layers = relu_mlp_layers(network)
        return None if layers is None else cls(*layers)

    def cross_entropy_gradient(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """d/dx of sum_i CE(f(x_i), y_i), in ``x``'s shape (no autograd graph is built)."""
        with torch.no_grad():
            h = x.flatten(1)
            masks = []
            for weight, bias in zip(self.weights[:-1], self.biases[:-1], strict=True):
                z = F.linear(h, weight, bias)
                masks.append(z > 0)
                h = z.clamp_min_(0)
            g = torch.softmax(F.linear(h, self.weights[-1], self.biases[-1]), 1)
            g[torch.arange(len(y)), y] -= 1
            g = g @ self.weights[-1]
            for weight, mask in zip(reversed(self.weights[:-1]), reversed(masks), strict=True):
                g = g.mul_(mask) @ weight
            return g.view_as(x)


def relu_mlp_layers(network: nn.Module) -> tuple[Normalize | None, list[nn.Linear]] | None:
    """``network``'s normalisation and Linear layers if it is ``[Normalize] Flatten (Linear
    ReLU)* Linear`` (nested ``nn.Sequential`` flattened), else None."""
    layers = _flat(network)
    normalize = layers.pop(0) if layers and isinstance(layers[0], Normalize) else None
    if not layers or not isinstance(layers[0], nn.Flatten) or layers[0].start_dim != 1:
        return None
    body = layers[1:]
    linears = body[0::2]
    if len(body) % 2 != 1 or not all(type(m) is nn.Linear for m in linears):
        return None
    if not all(type(m) is nn.ReLU for m in body[1::2]):
        return None
    return normalize, linears  # type: ignore[return-value]


def _flat(module: nn.Module) -> list[nn.Module]:
    if isinstance(module, nn.Sequential):
        return [leaf for child in module for leaf in _flat(child)]
    return [module]
