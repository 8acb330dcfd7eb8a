"""The built-in synthetic workloads: a small CNN and a ResNet-50 (torchvision's layout, without torchvision).

``hpcdl bench train`` and ``hpcdl scaling run --model`` train these on random images. Importing this module
imports torch.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """Four convolutions and two linear layers: 1.3 M parameters (5.2 MB of float32 gradients in 12
    tensors), on 3x32x32 images (any size: the last feature map is pooled to 4x4)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.conv4 = nn.Conv2d(128, 128, 3, padding=1)
        self.fc1 = nn.Linear(128 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = F.max_pool2d(F.relu(self.conv4(x)), 2)
        x = F.adaptive_avg_pool2d(x, 4)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Bottleneck(nn.Module):
    """ResNet's 1x1 reduce, 3x3, 1x1 expand block (stride on the 3x3, as torchvision's v1.5)."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.downsample(x))


class ResNet50(nn.Module):
    """ResNet-50: 53 convolutions, 53 batch norms and the classifier, 25,557,032 parameters (102 MB of
    float32 gradients in 161 tensors), any image size of at least 32x32."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers: list[nn.Module] = []
        in_channels = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for block in range(blocks):
                layers.append(Bottleneck(in_channels, width, stride if block == 0 else 1))
                in_channels = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# name -> (constructor, default image side, classes)
MODELS: dict[str, tuple[Callable[[], nn.Module], int, int]] = {
    "small": (SmallCNN, 32, 10),
    "resnet50": (ResNet50, 224, 1000),
}
