"""Benchmarks of horovod_gradcomp, run as ``python -m horovod_gradcomp.bench <command>``.

Each command lives in its own module (``codecs_bench`` for ``codecs``); see
:mod:`horovod_gradcomp.bench.__main__` for how commands are plugged in.
"""
from .shapes import resnet50_shapes, total_numel

__all__ = ["resnet50_shapes", "total_numel"]
