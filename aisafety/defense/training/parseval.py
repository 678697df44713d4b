"""Parseval networks (Cisse et al., 2017): keep every weight matrix a Parseval tight frame.

After each optimiser step every linear and convolutional weight W is pulled toward
W W^T = I by one gradient step of (beta / 2) ||W^T W - I||^2, the paper's retraction

    W <- (1 + beta) W - beta W W^T W.

A convolution is the matrix W of shape (out, in * kh * kw), and since each input pixel
enters at most kh * kw output positions (stride 1), its operator norm is at most
sqrt(kh * kw) ||W||_2; the retraction therefore targets W W^T = I / (kh * kw), so that
every layer is 1-Lipschitz in l2. With 1-Lipschitz ReLU, max-pooling and flattening the
network's l2 Lipschitz constant is then at most 1 / std of the input normalisation
(``lipschitz_bound``, which is sound for any weights: it is the product of the layers'
bounds). Weights start orthogonal (``orthogonal_init``), as in the paper.

Convex aggregation (Cisse et al.'s other constraint: the branches of a residual or
concatenating layer are summed with weights on the simplex) has nothing to act on in the
zoo architectures, which are plain chains; ``parseval_layers`` refuses a network with
layers it cannot bound instead of claiming a bound it does not hold.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.training.base import FitFunction, TrainingDefense, TrainingStep
from aisafety.errors import ConfigError
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import Normalize

# Layers with Lipschitz constant 1 in l2 that Parseval training leaves alone.
ONE_LIPSCHITZ = (nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Identity, nn.Sequential)


class ParsevalConfig(PluginConfig):
    beta: float = Field(default=0.0003, gt=0, le=0.5, description="retraction step")
    orthogonal_init: bool = Field(
        default=True,
        description="start from orthogonal weights (false to fine-tune from init_from's)",
    )


def parseval_layers(network: nn.Module) -> list[nn.Linear | nn.Conv2d]:
    """The linear and convolutional layers of ``network``; refuses any layer whose l2
    Lipschitz constant this defense cannot bound (a residual block, batch norm, ...)."""
    layers: list[nn.Linear | nn.Conv2d] = []
    for name, layer in network.named_modules():
        if isinstance(layer, nn.Linear | nn.Conv2d):
            if isinstance(layer, nn.Conv2d) and (layer.groups != 1 or layer.dilation != (1, 1)):
                raise ConfigError(
                    f"parseval: layer {name!r} is a grouped or dilated convolution; only "
                    "plain convolutions are bounded here"
                )
            layers.append(layer)
        elif not isinstance(layer, ONE_LIPSCHITZ + (Normalize,)) and name:
            raise ConfigError(
                f"parseval: layer {name!r} ({type(layer).__name__}) has no Lipschitz bound "
                "here; use an architecture of Linear, Conv2d, ReLU, MaxPool2d and Flatten"
            )
    return layers


def overlap(layer: nn.Linear | nn.Conv2d) -> int:
    """How many outputs one input value can enter at most: kh * kw for a convolution at
    stride 1 (fewer when the stride skips positions), 1 for a linear layer."""
    if isinstance(layer, nn.Linear):
        return 1
    (kh, kw), (sh, sw) = layer.kernel_size, layer.stride
    return math.ceil(kh / sh) * math.ceil(kw / sw)


def weight_matrix(layer: nn.Linear | nn.Conv2d) -> torch.Tensor:
    """The weight as (outputs, inputs), scaled so that its spectral norm bounds the layer's."""
    return layer.weight.reshape(layer.weight.shape[0], -1) * math.sqrt(overlap(layer))


@torch.no_grad()
def retract(layer: nn.Linear | nn.Conv2d, beta: float) -> None:
    """One step W <- (1 + beta) W - beta W W^T W on the scaled weight matrix."""
    w = weight_matrix(layer)
    w = (1 + beta) * w - beta * (w @ w.T) @ w
    layer.weight.copy_((w / math.sqrt(overlap(layer))).reshape(layer.weight.shape))


@torch.no_grad()
def orthogonal_init(layer: nn.Linear | nn.Conv2d) -> None:
    """Orthonormal rows (or columns, for a tall matrix) of the scaled weight matrix."""
    w = torch.empty_like(weight_matrix(layer))
    nn.init.orthogonal_(w)
    layer.weight.copy_((w / math.sqrt(overlap(layer))).reshape(layer.weight.shape))


def lipschitz_bound(network: nn.Module) -> float:
    """A sound upper bound on the l2 Lipschitz constant of ``network`` (a chain of the layers
    ``parseval_layers`` accepts, optionally behind ``Normalize``): the product of the layers'
    bounds, sqrt(overlap) * the spectral norm for linear maps, 1 / min(std) for Normalize."""
    bound = 1.0
    for layer in network.modules():
        if isinstance(layer, Normalize):
            bound /= float(layer.std.min())
    for layer in parseval_layers(network):
        bound *= float(torch.linalg.matrix_norm(weight_matrix(layer).detach(), ord=2))
    return bound


def parseval_deviation(network: nn.Module) -> float:
    """max over layers of ||W W^T - I||_2 for the scaled (fat) weight matrices: 0 for a
    Parseval tight frame."""
    worst = 0.0
    for layer in parseval_layers(network):
        w = weight_matrix(layer).detach()
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        eye = torch.eye(gram.shape[0], dtype=gram.dtype)
        worst = max(worst, float(torch.linalg.matrix_norm(gram - eye, ord=2)))
    return worst


def apgd_dlr_correct(
    predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
) -> torch.Tensor:
    """Per sample: still classified right after APGD-DLR (100 steps, Croce & Hein 2020)."""
    from aisafety.attack.apgd import APGDDLR

    return APGDDLR({})(predictor, x, y, eps).adv_pred == y


class ParsevalTraining(TrainingDefense):
    name = "parseval"
    description = "Parseval networks (Cisse et al. 2017): retraction to orthonormal weights"
    Config = ParsevalConfig
    adaptive_attack = "worst case of white-box PGD-40 and APGD-DLR"

    def prepare(self, network: nn.Module, fit: FitFunction) -> None:
        layers = parseval_layers(network)
        if self.config.orthogonal_init:
            for layer in layers:
                orthogonal_init(layer)

    def after_step(self, network: nn.Module) -> None:
        for layer in parseval_layers(network):
            retract(layer, self.config.beta)

    def adaptive_correct(
        self, predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """A Lipschitz bound shrinks the logits' range, and with it cross-entropy's gradient;
        APGD on the scale-free DLR loss does not mistake that for robustness."""
        return apgd_dlr_correct(predictor, x, y, eps)

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        return F.cross_entropy(network(x), y)
