"""Networks of the shapes users evaluate, with random weights: for mechanics, memory and speed.

No CIFAR-10 training set or ImageNet subset can be reached from the project's machines, so the
benches time these shapes with random weights (the time of a forward and backward pass does
not depend on the weights' values). Defined here rather than imported from torchvision so the
benches need nothing beyond torch.

- ``wide_resnet(28, 10)``: WRN-28-10 (Zagoruyko & Komodakis 2016; the RobustBench CIFAR-10
  backbone), pre-activation blocks, 36.5 M weights, 3x32x32 input.
- ``resnet50()``: ResNet-50 (He et al. 2016, torchvision's layout: bottlenecks with the stride
  on the 3x3 convolution), 25.6 M weights, 3x224x224 input.
"""

from __future__ import annotations

import torch
from torch import nn


class WideBlock(nn.Module):
    """Pre-activation basic block: BN-ReLU-conv3x3-BN-ReLU-conv3x3, 1x1 shortcut on a change."""

    def __init__(self, fan_in: int, fan_out: int, stride: int):
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(fan_in), nn.BatchNorm2d(fan_out)
        self.conv1 = nn.Conv2d(fan_in, fan_out, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(fan_out, fan_out, 3, 1, 1, bias=False)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        same = fan_in == fan_out and stride == 1
        self.shortcut = None if same else nn.Conv2d(fan_in, fan_out, 1, stride, 0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.relu1(self.bn1(x))
        out = self.conv2(self.relu2(self.bn2(self.conv1(pre))))
        return out + (x if self.shortcut is None else self.shortcut(pre))


def wide_resnet(depth: int = 28, widen: int = 10, num_classes: int = 10) -> nn.Module:
    """WRN-depth-widen for 3x32x32 inputs."""
    per_group = (depth - 4) // 6
    widths = [16, 16 * widen, 32 * widen, 64 * widen]
    layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)]
    for group in range(3):
        for i in range(per_group):
            fan_in = widths[group] if i == 0 else widths[group + 1]
            stride = 2 if group > 0 and i == 0 else 1
            layers.append(WideBlock(fan_in, widths[group + 1], stride))
    layers += [nn.BatchNorm2d(widths[3]), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers, nn.Linear(widths[3], num_classes))


class Bottleneck(nn.Module):
    """conv1x1-BN-ReLU, conv3x3 (stride)-BN-ReLU, conv1x1-BN, plus the shortcut, then ReLU."""

    def __init__(self, fan_in: int, width: int, stride: int):
        super().__init__()
        fan_out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(fan_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, fan_out, 1, bias=False), nn.BatchNorm2d(fan_out),
        )  # fmt: skip
        self.shortcut = (
            nn.Identity()
            if fan_in == fan_out and stride == 1
            else nn.Sequential(nn.Conv2d(fan_in, fan_out, 1, stride, bias=False),
                               nn.BatchNorm2d(fan_out))
        )  # fmt: skip
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000) -> nn.Module:
    """ResNet-50 for 3x224x224 inputs (blocks 3, 4, 6, 3)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]  # fmt: skip
    fan_in = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(fan_in, width, stride if i == 0 else 1))
            fan_in = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(fan_in, num_classes)]
    return nn.Sequential(*layers)


class SmallBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a (1x1-projected) shortcut, then ReLU."""

    def __init__(self, fan_in: int, fan_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(fan_in, fan_out, 3, stride, 1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(fan_out), nn.BatchNorm2d(fan_out)
        self.conv2 = nn.Conv2d(fan_out, fan_out, 3, 1, 1, bias=False)
        same = fan_in == fan_out and stride == 1
        self.shortcut = nn.Identity() if same else nn.Conv2d(fan_in, fan_out, 1, stride, bias=False)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(out + self.shortcut(x))


def small_resnet(num_classes: int = 10, width: int = 8) -> nn.Module:
    """Two residual blocks of ``width`` and twice it on any 3-channel input size
    (bench/scale.py; width 16 in bench/resnet_crown_speed.py)."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, 1, 1), nn.ReLU(), SmallBlock(width, width, 1),
        SmallBlock(width, 2 * width, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )  # fmt: skip


def small_cnn(num_classes: int = 10) -> nn.Module:
    """The SoK's Conv-Small layout for 1x28x28 (two strided convolutions, one hidden layer)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 4, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 4, 2, 1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 100), nn.ReLU(), nn.Linear(100, num_classes),
    )  # fmt: skip


SHAPES = {
    "wrn-28-10": (wide_resnet, (3, 32, 32), 10),
    "resnet-50": (resnet50, (3, 224, 224), 1000),
    "small-cnn": (small_cnn, (1, 28, 28), 10),
    "small-resnet": (small_resnet, (3, 32, 32), 10),
}


def build(
    name: str, seed: int = 0, side: int | None = None
) -> tuple[nn.Module, tuple[int, int, int], int]:
    """The network ``name`` with seeded random weights (BatchNorm in eval mode, running
    statistics at their initial 0/1), its input shape (``side``: another height and width,
    for the nets that pool globally) and class count."""
    factory, shape, classes = SHAPES[name]
    torch.manual_seed(seed)
    if side is not None:
        shape = (shape[0], side, side)
    return factory().eval(), shape, classes
