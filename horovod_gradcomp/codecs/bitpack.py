"""Pure-torch bit packing shared by the reference codecs.

Layout (the native kernels use the same): element i of a flat bool vector goes to byte
``i // 8``, bit ``i % 8`` (least significant bit first); pad bits of the last byte are 0.
"""
from __future__ import annotations

import torch


def pack_bits(flags: torch.Tensor) -> torch.Tensor:
    """bool[n] -> uint8[ceil(n/8)]."""
    n = flags.numel()
    padded = torch.zeros((n + 7) // 8 * 8, dtype=torch.uint8, device=flags.device)
    padded[:n] = flags.reshape(-1).to(torch.uint8)
    weights = (1 << torch.arange(8, device=flags.device, dtype=torch.uint8))
    return (padded.view(-1, 8) * weights).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8[>= ceil(n/8)] -> bool[n]."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    return ((packed.reshape(-1, 1) >> shifts) & 1).view(-1)[:n].bool()
