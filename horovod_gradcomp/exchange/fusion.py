"""Fuse many payloads into one flat byte buffer and cut K received buffers back apart.

The layout depends only on the (name, shape, dtype) list and the codec, never on the data,
so every rank computes the same one. Buffers are grouped by element size, largest first,
so each buffer starts at a multiple of its element size with no padding between them;
the total is padded to a multiple of 8 so that the rows of a ``[K, nbytes]`` receive
buffer keep that alignment.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

from ..codecs.base import Codec, Payload
from .staging import staging_for, staging_into

ALIGN = 8


@dataclass(frozen=True)
class Slot:
    """Where one buffer of one tensor's payload lives in the fused buffer."""
    key: str            # tensor name
    buffer: str         # buffer name within the payload
    dtype: torch.dtype
    numel: int
    offset: int         # in bytes

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class FusedLayout:
    """The fused wire layout of a list of tensors under one codec.

    ``entries`` is a list of ``(key, shape, dtype)`` in the exchange order (the same on
    every rank). ``nbytes`` is the size of one rank's fused buffer, padding included.
    """

    def __init__(self, codec: Codec, entries: Sequence[Tuple[str, torch.Size, torch.dtype]]):
        self.codec = codec
        self.entries = [(k, torch.Size(s), d) for k, s, d in entries]
        specs = [(k, name, dt, numel)
                 for k, shape, dtype in self.entries
                 for name, dt, numel in codec.layout(shape, dtype)]
        specs.sort(key=lambda s: -s[2].itemsize)  # stable: keeps the exchange order within a size
        self.slots: Dict[str, Dict[str, Slot]] = {k: {} for k, _, _ in self.entries}
        offset = 0
        for k, name, dt, numel in specs:
            self.slots[k][name] = Slot(k, name, dt, numel, offset)
            offset += numel * dt.itemsize
        self.payload_bytes = offset
        self.nbytes = (offset + ALIGN - 1) // ALIGN * ALIGN
        # The slots in offset order (they tile [0, payload_bytes) without gaps): packing is then
        # one concatenation and unpacking one split, instead of a slice and a copy per buffer.
        self._in_order = sorted((slot for slots in self.slots.values() for slot in slots.values()),
                                key=lambda slot: slot.offset)
        self._split_sizes = [slot.nbytes for slot in self._in_order]

    def pack(self, payloads: Dict[str, Payload], out: torch.Tensor | None = None, comm=None) -> torch.Tensor:
        """Copy every payload's buffers into one uint8 tensor of ``nbytes``: one concatenation
        on the payloads' device, staged for MPI (exchange/staging.py). The buffer is where
        :func:`~horovod_gradcomp.exchange.staging.staging_for` puts the bytes ``comm`` sends:
        host memory, or the payloads' CUDA device when ``comm`` takes buffers there (a
        CUDA-aware MPI). ``out`` (given): that buffer instead, on the host or the payloads'
        device."""
        parts = []
        for slot in self._in_order:
            src = payloads[slot.key].buffers[slot.buffer]
            if src.numel() != slot.numel or src.dtype != slot.dtype:
                raise ValueError(f"{self.codec.name}: payload buffer {slot.key}/{slot.buffer} is {src.numel()}x"
                                 f"{src.dtype}, layout expects {slot.numel}x{slot.dtype}")
            parts.append(src.reshape(-1).view(torch.uint8))
        if not parts:  # nothing to stage (a layout without buffers has no bytes)
            return out if out is not None else torch.empty(self.nbytes, dtype=torch.uint8)
        if out is not None:
            stage, buf = staging_into(parts[0].device, out.device), out
        else:
            stage = staging_for(parts[0].device, comm)
            buf = stage.empty(self.nbytes)
        if self.nbytes > self.payload_bytes:
            buf[self.payload_bytes:].zero_()
        stage.gather(parts, buf[:self.payload_bytes])
        return buf

    def unpack(self, recv: torch.Tensor, devices: Dict[str, torch.device]) -> List[Tuple[str, Payload]]:
        """Cut a ``[K, nbytes]`` receive buffer into one stacked payload per tensor (buffers are
        ``[K, numel]`` views of ``recv`` where it is on the tensor's device, else of one staged
        copy of it there: :func:`~horovod_gradcomp.exchange.staging.staging_into`)."""
        views_on: Dict[torch.device, Dict[Tuple[str, str], torch.Tensor]] = {}

        def views_for(device: torch.device):
            if device not in views_on:  # one staged copy of recv per device, split once
                src = staging_into(device, recv.device).scatter(recv)
                pieces = torch.split(src[:, :self.payload_bytes], self._split_sizes, dim=1) \
                    if self._split_sizes else ()
                views_on[device] = {(slot.key, slot.buffer): piece.view(slot.dtype)
                                    for slot, piece in zip(self._in_order, pieces)}
            return views_on[device]

        out = []
        for k, shape, dtype in self.entries:
            device = devices[k]
            views = views_for(device)
            out.append((k, Payload({name: views[(k, name)] for name in self.slots[k]}, shape, dtype, device)))
        return out


def pack_variable(names: Sequence[str], payloads: Dict[str, Payload], comm=None) -> torch.Tensor:
    """Serialize payloads whose sizes vary from step to step (one rank's part of an allgatherv),
    into a buffer where ``comm`` sends it from (:meth:`FusedLayout.pack`).

    Format: int64 byte length of every buffer of every tensor (tensors in ``names`` order,
    buffers in payload order), then the buffers, each padded to a multiple of 8 bytes so that
    every buffer, and the whole part, stays 8-byte aligned."""
    blobs = [payloads[n].buffers[b].reshape(-1).view(torch.uint8) for n in names for b in payloads[n].buffers]
    header = torch.tensor([x.numel() for x in blobs], dtype=torch.int64).view(torch.uint8)
    device = blobs[0].device if blobs else torch.device("cpu")
    parts = [header.to(device)]
    for x in blobs:
        parts.append(x)
        pad = (ALIGN - x.numel() % ALIGN) % ALIGN
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=device))
    stage = staging_for(device, comm)
    return stage.gather(parts, stage.empty(sum(p.numel() for p in parts)))


def unpack_variable(part: torch.Tensor, names: Sequence[str], templates: Dict[str, Payload]) -> Dict[str, Payload]:
    """Inverse of :func:`pack_variable` for one rank's part; ``templates`` (this rank's own
    payloads) give each buffer's name and dtype and each tensor's shape, dtype and device.

    The part comes from another rank: its header is checked before anything is cut (every
    length >= 0, a multiple of its buffer's element size, inside the part, the padded buffers
    ending exactly at the part's end); a malformed part raises ValueError."""
    count = sum(len(templates[n].buffers) for n in names)
    if not isinstance(part, torch.Tensor) or part.dtype != torch.uint8 or part.dim() != 1:
        raise ValueError(f"unpack_variable: a part must be a flat uint8 tensor, got "
                         f"{getattr(part, 'dtype', type(part).__name__)} {tuple(getattr(part, 'shape', ()))}")
    size = part.numel()
    if size < 8 * count:
        raise ValueError(f"unpack_variable: a part of {size} bytes cannot hold the {count} buffer lengths")
    lengths = part[:8 * count].clone().view(torch.int64).tolist()
    offset, i, out = 8 * count, 0, {}
    devices = {templates[n].device for n in names}
    staged = {d: staging_into(d, part.device).scatter(part) for d in devices}
    for n in names:
        t = templates[n]
        bufs = {}
        for b, ref in t.buffers.items():
            nbytes = lengths[i]
            i += 1
            item = ref.element_size()
            if nbytes < 0 or nbytes % item or nbytes > size - offset:
                raise ValueError(f"unpack_variable: buffer {n}/{b} claims {nbytes} bytes; {size - offset} remain "
                                 f"in the part and its {ref.dtype} elements take {item} bytes each")
            bufs[b] = staged[t.device][offset:offset + nbytes].view(ref.dtype)
            offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
        out[n] = Payload(bufs, t.shape, t.dtype, t.device)
    if offset != size:
        raise ValueError(f"unpack_variable: the buffers end at byte {offset} of a {size}-byte part")
    return out
