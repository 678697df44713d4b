"""CIFAR-sized residual networks for the verification tests (random weights)."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv-BN-ReLU-conv-BN plus a (projected) shortcut, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    """The CIFAR ResNet of Kuang Liu's pytorch-cifar: a 3x3 stem, four stages of blocks."""

    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), width: int = 64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        layers, cin = [], width
        for stage, count in enumerate(blocks):
            cout = width * 2**stage
            for k in range(count):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and k == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(torch.relu(self.stem(x)))
        return self.fc(torch.flatten(self.pool(h), 1))


def random_resnet(blocks=(2, 2, 2, 2), width: int = 64, seed: int = 0) -> CifarResNet:
    """ResNet-18 by default, random weights and BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    net = CifarResNet(blocks, width)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    return net.eval()
