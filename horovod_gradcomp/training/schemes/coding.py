"""Encode a range of the flat parameter vector through a codec, one piece per parameter.

A scheme moves a contiguous range ``[lo, hi)`` of the flattened parameters (the whole
vector, or the shard one rank owns). With a codec, each parameter's part of the range is
encoded on its own (a parameter wholly inside the range keeps its shape, so per-row or
per-column codecs see the layout they expect) with an error-feedback residual per piece.
Without a codec the message is the raw values. The sender also gets back exactly what the
receiver will decode, so both sides can account for the same update.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...codecs.base import Codec
from ...state.error_feedback import ErrorFeedback
from .wire import pack_payload, unpack_payload

# (residual key, start offset in the flat vector, shape of the piece)
Piece = Tuple[str, int, torch.Size]


def pieces_of_range(names: Sequence[str], shapes: Sequence[torch.Size], lo: int, hi: int) -> List[Piece]:
    """The parts of the parameters (in flat order) that fall in ``[lo, hi)``."""
    out: List[Piece] = []
    off = 0
    for name, shape in zip(names, shapes):
        n = int(torch.Size(shape).numel())
        a, b = max(lo, off), min(hi, off + n)
        if a < b:
            whole = a == off and b == off + n
            out.append((f"{name}[{a - off}:{b - off}]", a, torch.Size(shape) if whole else torch.Size([b - a])))
        off += n
    return out


class RangeCoder:
    """Messages for one range of the flat vector: ``encode(values) -> (message, decoded)``
    and ``decode(message) -> values``. ``codec=None`` sends the raw values."""

    def __init__(self, pieces: Sequence[Piece], lo: int, hi: int, dtype: torch.dtype,
                 codec: Optional[Codec] = None, feedback: Optional[ErrorFeedback] = None):
        self.pieces, self.lo, self.hi, self.dtype = list(pieces), lo, hi, dtype
        self.codec, self.feedback = codec, feedback

    @property
    def numel(self) -> int:
        return self.hi - self.lo

    def encode(self, values: torch.Tensor) -> Tuple[np.ndarray, torch.Tensor]:
        """``values`` (flat, ``hi - lo`` elements, CPU) -> (uint8 message, what ``decode`` of it returns)."""
        if values.numel() != self.numel:
            raise ValueError(f"RangeCoder: expected {self.numel} values, got {values.numel()}")
        if self.codec is None:
            v = values.detach().to(self.dtype).contiguous()
            return v.view(torch.uint8).numpy(), v
        parts, decoded = [], torch.empty(self.numel, dtype=self.dtype)
        for key, start, shape in self.pieces:
            n = shape.numel()
            piece = values[start - self.lo:start - self.lo + n].reshape(shape).to(self.dtype).contiguous()
            payload = (self.feedback.encode(self.codec, key, piece) if self.feedback is not None
                       else self.codec.encode(piece))
            decoded[start - self.lo:start - self.lo + n] = self.codec.decode(payload).reshape(-1)
            packed = pack_payload(payload)
            parts += [np.asarray([packed.size], dtype=np.int64).view(np.uint8), packed]
        return np.concatenate(parts) if parts else np.zeros(0, np.uint8), decoded

    def decode(self, message: np.ndarray, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The values a message stands for (flat, ``hi - lo`` elements)."""
        out = torch.empty(self.numel, dtype=self.dtype) if out is None else out
        if self.codec is None:
            if message.size != self.numel * out.element_size():
                raise ValueError(f"RangeCoder: a raw message of {message.size} bytes for {self.numel} values")
            out.copy_(torch.from_numpy(np.ascontiguousarray(message)).view(self.dtype))
            return out
        pos = 0
        for _, start, shape in self.pieces:
            size = int(message[pos:pos + 8].view(np.int64)[0])
            payload = unpack_payload(message[pos + 8:pos + 8 + size], shape, self.dtype)
            pos += 8 + size
            out[start - self.lo:start - self.lo + shape.numel()] = self.codec.decode(payload).reshape(-1)
        if pos != message.size:
            raise ValueError(f"RangeCoder: message has {message.size} bytes, pieces used {pos}")
        return out
