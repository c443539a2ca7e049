"""Parameter shapes of reference models, written out by hand (no torchvision needed).

The shapes come in the order of ``model.named_parameters()`` so that a benchmark over
them sees the same mix of tensor sizes a data-parallel training step would.
"""
from __future__ import annotations

import math
from typing import List, Tuple

Shape = Tuple[int, ...]

#: Sizes torchvision's resnet50 must reproduce (``sum(p.numel() for p in m.parameters())``).
RESNET50_TENSORS = 161
RESNET50_NUMEL = 25_557_032


def _conv(cout: int, cin: int, k: int) -> Shape:
    """Weight of a bias-free k x k convolution."""
    return (cout, cin, k, k)


def _bn(c: int) -> List[Shape]:
    """Weight and bias of a BatchNorm2d (running statistics are buffers, not parameters)."""
    return [(c,), (c,)]


def _bottleneck(inplanes: int, planes: int, downsample: bool) -> List[Shape]:
    """One torchvision ``Bottleneck`` (expansion 4): 1x1, 3x3, 1x1 convs each followed by
    a BatchNorm, then the 1x1 projection shortcut (+ its BatchNorm) when ``downsample``."""
    out = planes * 4
    shapes = [_conv(planes, inplanes, 1), *_bn(planes),
              _conv(planes, planes, 3), *_bn(planes),
              _conv(out, planes, 1), *_bn(out)]
    if downsample:
        shapes += [_conv(out, inplanes, 1), *_bn(out)]
    return shapes


def resnet50_shapes(num_classes: int = 1000) -> List[Shape]:
    """The 161 parameter shapes of torchvision's ``resnet50()``, in ``named_parameters()``
    order: stem conv + BN, four stages of [3, 4, 6, 3] bottlenecks (the first block of
    each stage has the projection shortcut), and the 2048 -> ``num_classes`` classifier."""
    shapes: List[Shape] = [_conv(64, 3, 7), *_bn(64)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += _bottleneck(inplanes, planes, downsample=(b == 0))
            inplanes = planes * 4
    shapes += [(num_classes, inplanes), (num_classes,)]
    return shapes


def total_numel(shapes: List[Shape]) -> int:
    """Sum of the element counts of ``shapes``."""
    return sum(math.prod(s) for s in shapes)
