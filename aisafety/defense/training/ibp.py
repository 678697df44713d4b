"""Interval bound propagation (Gowal et al., 2018) and CROWN-IBP (Zhang et al., 2020).

Bounds are on the margins m_j = f_y(x') - f_j(x') over the l-inf ball of radius eps around
x intersected with [0, 1]; m_j > 0 for every j != y certifies the prediction.

* IBP pushes a box through the network (an affine layer maps centre c and radius r to
  W c + b and |W| r; ReLU, max- and average-pooling are monotone) and folds the margin
  matrix C into the last linear layer ("elision", Gowal et al. Sec. 3), which is tighter
  than subtracting the logit intervals.
* CROWN-IBP bounds C f(x') by one backward linear relaxation (CROWN, Zhang et al. 2018)
  whose ReLU relaxations use the IBP pre-activation bounds: upper line u/(u-l) (z - l),
  lower line z if u > -l else 0. It needs Linear, Conv2d, ReLU, Flatten and
  normalisation layers only (no max-pooling: use the ``mnist-cnn-strided`` architecture).

Training mixes a clean and a robust cross-entropy with the schedules of Zhang et al.:
eps ramps linearly from 0, kappa (weight of the clean loss) goes from 1 to ``kappa_end``
and beta (weight of the CROWN-IBP bound against the IBP one) from 1 to 0 over the ramp.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from aisafety.config_base import PluginConfig
from aisafety.defense.training.base import TrainingDefense, TrainingStep
from aisafety.errors import ConfigError
from aisafety.prediction.torch_module import Normalize

Box = tuple[torch.Tensor, torch.Tensor]
MONOTONE = (nn.ReLU, nn.Flatten, nn.MaxPool2d, nn.AvgPool2d)


def layers_of(network: nn.Module) -> list[nn.Module]:
    """The leaf layers of nested ``nn.Sequential`` containers, in order."""
    if isinstance(network, nn.Sequential):
        return [leaf for child in network for leaf in layers_of(child)]
    return [network]


def _unsupported(layer: nn.Module, method: str) -> ConfigError:
    return ConfigError(
        f"{method} cannot bound layer {type(layer).__name__}; supported: Linear, Conv2d, ReLU, "
        "Flatten, normalisation"
        + (", MaxPool2d, AvgPool2d" if method == "IBP" else "")
        + "; use an nn.Sequential of those (e.g. the 'mnist-cnn-strided' architecture)"
    )


def interval_step(layer: nn.Module, lower: torch.Tensor, upper: torch.Tensor) -> Box:
    """The box of ``layer``'s output given the box of its input."""
    if isinstance(layer, MONOTONE):
        return layer(lower), layer(upper)
    if isinstance(layer, Normalize):  # std > 0: increasing per channel
        return layer(lower), layer(upper)
    if isinstance(layer, nn.Linear | nn.Conv2d):
        centre, radius = (upper + lower) / 2, (upper - lower) / 2
        mid = layer(centre)
        if isinstance(layer, nn.Linear):
            spread = F.linear(radius, layer.weight.abs())
        else:
            spread = layer._conv_forward(radius, layer.weight.abs(), None)
        return mid - spread, mid + spread
    raise _unsupported(layer, "IBP")


def input_box(x: torch.Tensor, eps: float) -> Box:
    return (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)


def margin_matrix(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """C with C[b, j] = e_y - e_j, so C f = (f_y - f_j)_j (row y is zero)."""
    eye = torch.eye(num_classes, device=y.device)
    return eye[y].unsqueeze(1) - eye.unsqueeze(0)


def ibp_boxes(network: nn.Module, x: torch.Tensor, eps: float) -> tuple[list[nn.Module], list[Box]]:
    """The layers and the box at the input of each one (the last box feeds the last layer)."""
    layers = layers_of(network)
    if not isinstance(layers[-1], nn.Linear):
        raise ConfigError(
            f"bounds need the network to end in nn.Linear, it ends in {type(layers[-1]).__name__}"
        )
    boxes = [input_box(x, eps)]
    for layer in layers[:-1]:
        boxes.append(interval_step(layer, *boxes[-1]))
    return layers, boxes


def ibp_margin_bounds(network: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float):
    """Lower bounds (batch, classes) of f_y - f_j over the eps-ball, by IBP with elision."""
    layers, boxes = ibp_boxes(network, x, eps)
    return _elided_lower(layers[-1], boxes[-1], y)


def _elided_lower(last: nn.Linear, box: Box, y: torch.Tensor) -> torch.Tensor:
    c = margin_matrix(y, last.out_features)
    weight, bias = c @ last.weight, c @ last.bias  # (B, K, in), (B, K)
    centre, radius = (box[1] + box[0]) / 2, (box[1] - box[0]) / 2
    mid = (weight @ centre.unsqueeze(2)).squeeze(2) + bias
    return mid - (weight.abs() @ radius.unsqueeze(2)).squeeze(2)


def _back_affine(
    layer: nn.Module, a: torch.Tensor, input_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """A W and A b for A (B, K, *out) and an affine ``layer`` with input shape ``input_shape``."""
    b, k = a.shape[:2]
    if isinstance(layer, nn.Linear):
        bias = a @ layer.bias if layer.bias is not None else a.new_zeros(b, k)
        return a @ layer.weight, bias
    if isinstance(layer, nn.Conv2d):
        bias = (a.sum((3, 4)) * layer.bias).sum(2) if layer.bias is not None else a.new_zeros(b, k)
        flat = a.reshape(b * k, *a.shape[2:])
        stride, padding, dilation = layer.stride, layer.padding, layer.dilation
        size = [
            (flat.shape[2 + i] - 1) * stride[i] - 2 * padding[i]  # type: ignore[index]
            + dilation[i] * (layer.kernel_size[i] - 1) + 1
            for i in range(2)
        ]  # fmt: skip
        extra = [input_shape[-2 + i] - size[i] for i in range(2)]
        back = F.conv_transpose2d(
            flat, layer.weight, None, stride, padding, tuple(extra), layer.groups, dilation
        )
        return back.reshape(b, k, *input_shape[1:]), bias
    if isinstance(layer, Normalize):
        scale = (1 / layer.std).unsqueeze(0)  # (1, 1, C, 1, 1)
        shift = (-layer.mean / layer.std).unsqueeze(0)
        return a * scale, (a * shift).flatten(2).sum(2)
    raise _unsupported(layer, "CROWN-IBP")


def crown_ibp_margin_bounds(
    network: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float
) -> torch.Tensor:
    """Lower bounds of f_y - f_j by CROWN's backward pass on IBP intermediate bounds."""
    layers, boxes = ibp_boxes(network, x, eps)
    last = layers[-1]
    c = margin_matrix(y, last.out_features)
    a, bias = c @ last.weight, c @ last.bias
    for layer, (lower, upper) in zip(reversed(layers[:-1]), reversed(boxes[:-1]), strict=True):
        if isinstance(layer, nn.Flatten):
            a = a.reshape(*a.shape[:2], *lower.shape[1:])
        elif isinstance(layer, nn.ReLU):
            a, bias = _back_relu(a, bias, lower, upper)
        else:
            a, shift = _back_affine(layer, a, lower.shape)
            bias = bias + shift
    lower, upper = boxes[0]
    pos, neg = a.clamp(min=0), a.clamp(max=0)
    dims = tuple(range(2, a.dim()))
    return (pos * lower.unsqueeze(1)).sum(dims) + (neg * upper.unsqueeze(1)).sum(dims) + bias


def _back_relu(
    a: torch.Tensor, bias: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Relax ReLU(z), l <= z <= u, in the direction that lower-bounds A ReLU(z)."""
    unstable = (lower < 0) & (upper > 0)
    up_slope = torch.where(unstable, upper / (upper - lower).clamp(min=1e-12), (lower >= 0).float())
    up_intercept = torch.where(unstable, -up_slope * lower, torch.zeros_like(lower))
    low_slope = torch.where(unstable, (upper > -lower).float(), (lower >= 0).float())
    pos, neg = a.clamp(min=0), a.clamp(max=0)
    dims = tuple(range(2, a.dim()))
    bias = bias + (neg * up_intercept.unsqueeze(1)).sum(dims)
    return pos * low_slope.unsqueeze(1) + neg * up_slope.unsqueeze(1), bias


def certified(lower_margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """True where every margin to another class has a positive lower bound."""
    others = lower_margins.scatter(1, y.unsqueeze(1), float("inf"))
    return (others > 0).all(1)


def robust_cross_entropy(lower_margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CE of the worst-case logits -m (Gowal et al. eq. 7): y scores 0, class j scores -m_j."""
    return F.cross_entropy(-lower_margins, y)


class IBPTrainingConfig(PluginConfig):
    eps: float = Field(default=0.1, ge=0, description="training radius (often above the test eps)")
    warmup_epochs: float = Field(default=1.0, ge=0, description="clean training before the ramp")
    ramp_epochs: float = Field(default=3.0, ge=0, description="eps 0 -> eps, kappa 1 -> kappa_end")
    kappa_end: float = Field(default=0.5, ge=0, le=1)


class CrownIBPTrainingConfig(IBPTrainingConfig):
    kappa_end: float = Field(default=0.0, ge=0, le=1)


def ramp(progress: float, warmup: float, length: float) -> float:
    """0 during warm-up, then linear to 1 over ``length`` epochs."""
    if progress < warmup:
        return 0.0
    return 1.0 if length <= 0 else min(1.0, (progress - warmup) / length)


class IBPTraining(TrainingDefense):
    name = "ibp"
    description = "interval bound propagation training (Gowal et al. 2018), l-inf certified"
    Config = IBPTrainingConfig
    crown_weight_start = 0.0  # beta at the start of the ramp; IBP never uses CROWN

    def loss(
        self, network: nn.Module, x: torch.Tensor, y: torch.Tensor, step: TrainingStep
    ) -> torch.Tensor:
        c = self.config
        t = ramp(step.progress, c.warmup_epochs, c.ramp_epochs)
        kappa = 1 - t * (1 - c.kappa_end)
        clean = F.cross_entropy(network(x), y)
        if t == 0:
            return clean
        eps, beta = t * c.eps, self.crown_weight_start * (1 - t)
        bound = ibp_margin_bounds(network, x, y, eps)
        if beta > 0:
            bound = beta * crown_ibp_margin_bounds(network, x, y, eps) + (1 - beta) * bound
        return kappa * clean + (1 - kappa) * robust_cross_entropy(bound, y)


class CrownIBPTraining(IBPTraining):
    name = "crown-ibp"
    description = "CROWN-IBP certified training (Zhang et al. 2020), l-inf"
    Config = CrownIBPTrainingConfig
    crown_weight_start = 1.0
