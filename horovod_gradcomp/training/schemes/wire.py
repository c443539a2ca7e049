"""A codec payload as one flat byte buffer and back (what a scheme sends in one message).

Layout: int64 header ``[n_buffers, (dtype code, numel, name length) * n_buffers]``, the
names (UTF-8, padded to 8 bytes), then each buffer's bytes in wire order, each padded to
8 bytes. The header travels and is counted in the bytes a scheme reports. Shape, dtype and
device of the encoded tensor are known to both sides and are not sent.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from ...codecs.base import Payload

_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool)
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def pack_payload(payload: Payload) -> np.ndarray:
    """The payload's buffers (moved to CPU) and a header as one contiguous uint8 array."""
    items = list(payload.buffers.items())
    names = [n.encode() for n, _ in items]
    header = [len(items)]
    for (name, buf), raw in zip(items, names):
        if buf.dtype not in _CODE:
            raise TypeError(f"pack_payload: buffer {name!r} has unsupported dtype {buf.dtype}")
        header += [_CODE[buf.dtype], buf.numel(), len(raw)]
    head = np.asarray(header, dtype=np.int64).view(np.uint8)
    sizes = [_pad8(len(r)) for r in names] + [_pad8(b.numel() * b.element_size()) for _, b in items]
    out = np.zeros(head.size + sum(sizes), dtype=np.uint8)
    out[:head.size] = head
    pos = head.size
    for raw in names:
        out[pos:pos + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        pos += _pad8(len(raw))
    for _, buf in items:
        flat = buf.detach().reshape(-1).cpu().contiguous()
        nbytes = flat.numel() * flat.element_size()
        out[pos:pos + nbytes] = flat.view(torch.uint8).numpy()
        pos += _pad8(nbytes)
    return out


def unpack_payload(data: np.ndarray, shape, dtype: torch.dtype) -> Payload:
    """Inverse of :func:`pack_payload` for a tensor of ``shape`` and ``dtype`` (CPU)."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.size < 8:
        raise ValueError(f"unpack_payload: {data.size} bytes is no payload")
    n = int(data[:8].view(np.int64)[0])
    if n < 0 or 8 * (1 + 3 * n) > data.size:
        raise ValueError(f"unpack_payload: corrupt header ({n} buffers in {data.size} bytes)")
    meta = data[8:8 * (1 + 3 * n)].view(np.int64).reshape(n, 3)
    pos = 8 * (1 + 3 * n)
    names = []
    for _, _, name_len in meta:
        names.append(bytes(data[pos:pos + int(name_len)]).decode())
        pos += _pad8(int(name_len))
    buffers: Dict[str, torch.Tensor] = {}
    for name, (code, numel, _) in zip(names, meta):
        dt = _DTYPES[int(code)]
        nbytes = int(numel) * dt.itemsize
        if pos + nbytes > data.size:
            raise ValueError(f"unpack_payload: buffer {name!r} runs past the end of the message")
        buffers[name] = torch.from_numpy(data[pos:pos + nbytes].copy()).view(dt)
        pos += _pad8(nbytes)
    return Payload(buffers, torch.Size(shape), dtype)
