"""Sharded mode's compression state as tensors for ``torch.distributed.checkpoint`` (DCP).

``FSDPCompressionState`` is a DCP ``Stateful``: put it next to the model and the optimizer and
``dcp.save`` / ``dcp.load`` write and restore it with them::

    dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "compression": state}, ...)

Every rank's compression state differs (its residuals remember what it failed to send of every
chunk), so each piece is stored as a ``DTensor`` over the FSDP modules' 1-D mesh of all K ranks,
of global shape ``[K, ...]`` and sharded on dim 0, each rank holding its own row: DCP writes each
row once, from its rank, and reads it back into the same rank. The pieces, in this order:

* ``world_size``: ``[K]`` int64, row r holding r. Loading at another world size fails on this key
  first, on every rank, with DCP's "Size mismatch between saved torch.Size([K]) and current:
  torch.Size([K'])" for ``<name>.world_size`` (both sizes named; the state cannot be redistributed);
  the compression's own ``load_state_dict`` checks the size again with its own message;
* ``meta``: ``[K, 65536]`` uint8 and ``meta_bytes`` ``[K, 1]``: everything that is not a memory
  tensor (codec, options, steps, the memory's counters, which keys each store holds, in which dtype
  and on which device), in :func:`~horovod_gradcomp.state.checkpoint_data.to_bytes`'s format and
  read back with ``weights_only=True`` (:func:`~horovod_gradcomp.state.checkpoint_data.from_bytes`);
* one ``[K, N]`` float32 per memory store the memory has (``residuals``; DGC's ``velocities`` and
  ``accumulations``), N = every segment of every chunk of every module, at fixed offsets from the
  layouts. Float32 holds fp32, bf16 and fp16 values exactly; fp64 residuals are refused.

Nothing is unpickled: DCP reads tensors only (no ``bytes`` items, which its loader would read with
``torch.load(weights_only=False)``).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from ..state.checkpoint_data import from_bytes, to_bytes

#: Bytes reserved per rank for the non-tensor part of the state.
META_CAPACITY = 1 << 16
_EXACT = (torch.float32, torch.bfloat16, torch.float16)


def _slots(state) -> Tuple[Dict[str, Tuple[int, torch.Size]], int]:
    """Offset and shape of every memory key in the flat store tensors, and their total length."""
    slots, offset = {}, 0
    for comm in state.comms:
        for j in range(comm.layout.world_size):
            for seg, key in zip(comm.layout.segments, comm.layout.keys(j)):
                slots[key] = (offset, seg.shape)
                offset += seg.numel
    return slots, offset


def _device(mesh) -> torch.device:
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, getattr(torch, mesh.device_type).current_device())


def _rows(mesh, local: torch.Tensor, row: bool = True):
    """``local`` as this rank's row (``row``) or element of a DTensor sharded on dim 0 over ``mesh``."""
    from torch.distributed.tensor import DTensor, Shard
    return DTensor.from_local(local.unsqueeze(0) if row else local, mesh, [Shard(0)], run_check=False)


def _stores(memory) -> List[str]:
    """The memory's tensor stores (:meth:`~horovod_gradcomp.state.memory.Memory.stores`), each
    saved as one flat tensor."""
    return list(memory.stores())


def dcp_state_dict(state) -> dict:
    """This rank's row of every piece (see the module doc); a collective-free call."""
    mesh, comm = state.mesh, state.communicator
    owner = f"hgc.fsdp ({state.codec.name}) checkpoint"
    slots, total = _slots(state)
    device = _device(mesh)
    full = state.compression.state_dict()
    memory_state = dict(full.get("memory_state") or {})
    flats, layout = {}, {}
    for store in _stores(state.memory):
        flat = torch.zeros(total, dtype=torch.float32, device=device)
        layout[store] = {}
        for key, tensor in dict(memory_state.get(store) or {}).items():
            if key not in slots:
                raise ValueError(f"{owner}: the memory holds {key!r}, which no registered module's layout has")
            if tensor.dtype not in _EXACT:
                raise NotImplementedError(f"{owner}: {store} {key!r} is {tensor.dtype}; the checkpoint stores "
                                          "float32, bf16 and fp16 state exactly, not this dtype")
            offset, shape = slots[key]
            flat[offset: offset + shape.numel()].copy_(tensor.reshape(-1))
            layout[store][key] = [str(tensor.dtype).replace("torch.", ""), str(tensor.device)]
        memory_state[store] = {}
        flats[store] = flat
    meta = to_bytes({**full, "memory_state": memory_state, "stores": layout})
    if meta.numel() > META_CAPACITY:
        raise ValueError(f"{owner}: the state's non-tensor part takes {meta.numel()} bytes, more than the "
                         f"{META_CAPACITY} reserved for it")
    padded = torch.zeros(META_CAPACITY, dtype=torch.uint8, device=device)
    padded[: meta.numel()].copy_(meta)
    out = {"world_size": _rows(mesh, torch.tensor([comm.rank], dtype=torch.int64, device=device), row=False)}
    out["meta"] = _rows(mesh, padded)
    out["meta_bytes"] = _rows(mesh, torch.tensor([meta.numel()], dtype=torch.int64, device=device))
    for store, flat in flats.items():
        out[store] = _rows(mesh, flat)
    return out


def load_dcp_state_dict(state, saved: dict) -> None:
    """Restore this rank's row of :func:`dcp_state_dict`'s pieces (as ``dcp.load`` filled them)."""
    owner = f"hgc.fsdp ({state.codec.name}) checkpoint"
    k = state.communicator.size
    missing = [p for p in ("world_size", "meta", "meta_bytes", *_stores(state.memory)) if p not in saved]
    if missing:
        raise ValueError(f"{owner}: the checkpoint lacks {missing}: it was not written by an "
                         "FSDPCompressionState of this codec")
    rows = int(saved["world_size"].shape[0])
    if rows != k:
        raise ValueError(f"{owner}: this checkpoint was written by a job of {rows} ranks; this job has {k}. "
                         "The compression state (each rank's residuals of every chunk) cannot be redistributed "
                         "to another number of ranks: start it fresh instead (do not load it)")

    def local(piece):
        return piece.to_local()[0] if hasattr(piece, "to_local") else piece[state.communicator.rank]

    n = int(local(saved["meta_bytes"]).reshape(-1)[0])
    if not 0 < n <= META_CAPACITY:
        raise ValueError(f"{owner}: the checkpoint's state part has {n} bytes (expected 1..{META_CAPACITY})")
    full = from_bytes(local(saved["meta"])[:n], f"{owner}: rank {state.communicator.rank}'s state")
    slots, _ = _slots(state)
    memory_state = dict(full["memory_state"])
    for store, keys in dict(full.pop("stores")).items():
        flat = local(saved[store])
        tensors = {}
        for key, (dtype, device) in keys.items():
            if key not in slots:
                raise ValueError(f"{owner}: the checkpoint's {store} hold {key!r}, which no registered module's "
                                 "layout has (another model?)")
            offset, shape = slots[key]
            tensors[key] = flat[offset: offset + shape.numel()].reshape(shape).to(
                device=torch.device(device), dtype=getattr(torch, dtype), copy=True)
        memory_state[store] = tensors
    state.compression.load_state_dict({**full, "memory_state": memory_state})
