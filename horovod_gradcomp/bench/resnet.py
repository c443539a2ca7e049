"""ResNet-50 as a module, for benchmarks that need its real backward pass (no torchvision).

:func:`resnet50` builds torchvision's architecture (bottlenecks [3, 4, 6, 3], stride on the
3x3 conv, projection shortcuts): its parameters have exactly the shapes, in the same
``named_parameters()`` order, of :func:`~horovod_gradcomp.bench.shapes.resnet50_shapes`
(checked by the tests). Input: ``[N, 3, H, W]`` images of any size >= 32.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride) -> 1x1 convs with BatchNorm, ReLU, and the shortcut."""

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: bool):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                           if downsample else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes, stages = 64, []
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layer = [Bottleneck(inplanes, planes, stride, downsample=True)]
            inplanes = planes * 4
            layer += [Bottleneck(inplanes, planes, 1, downsample=False) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000) -> ResNet50:
    """A freshly initialized ResNet-50 (PyTorch's default initialization)."""
    return ResNet50(num_classes)


__all__ = ["ResNet50", "resnet50"]
