"""What one rank sends for one tensor: :class:`Payload`, and the layout of its buffers
(:data:`BufferSpec`). Data only; the codecs (:mod:`horovod_gradcomp.codecs.base`) make and
read them, :mod:`horovod_gradcomp.codecs.payload_checks` checks received ones."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch

__all__ = ["BufferSpec", "Payload"]

# (buffer name, dtype, number of elements) of one buffer of a payload, in wire order.
BufferSpec = Tuple[str, torch.dtype, int]


@dataclass
class Payload:
    """What one rank sends for one tensor.

    ``buffers`` are flat tensors, in wire order; ``nbytes`` counts exactly the bytes they
    hold (packed data, scales and headers alike). ``shape``/``dtype``/``device`` describe
    the tensor that was encoded; they are known to every rank and are not sent.
    A *stacked* payload carries K ranks' payloads at once: each buffer then has shape
    ``[K, numel]`` (rows may be strided views into a receive buffer).
    """

    buffers: Dict[str, torch.Tensor]
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self):
        # One spelling per device, so that comparing it with a tensor's device is exact: a name or
        # a bare "cuda" becomes the torch.device with its index (the current CUDA device).
        if not isinstance(self.device, torch.device) or (self.device.type == "cuda" and self.device.index is None):
            device = torch.device(self.device)
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            self.device = device

    @property
    def nbytes(self) -> int:
        """Exact bytes held by the buffers (K payloads' worth for a stacked payload)."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n
