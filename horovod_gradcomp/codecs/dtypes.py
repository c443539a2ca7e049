"""Gradient dtypes the codecs accept, and the precision they compute in."""
from __future__ import annotations

import torch

#: Every codec encodes gradients of these dtypes.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 gradients, float32 for every narrower float (sums, means, scales)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_float(codec: str, tensor: torch.Tensor) -> None:
    """Raise ``TypeError`` naming ``codec`` unless ``tensor`` is fp16/bf16/fp32/fp64."""
    if tensor.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{codec}: gradients must be fp16/bf16/fp32/fp64, got {tensor.dtype}")
