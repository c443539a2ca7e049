"""HSDP mode's compression state as tensors for ``torch.distributed.checkpoint`` (DCP).

The rows of :mod:`horovod_gradcomp.fsdp.checkpoint` (one row per rank of the job, over a 1-D mesh
of all K ranks, ``world_size`` and the layout piece first so that another world size or split into
nodes is refused naming both),
filled with the state of every module's compression (one per ``FSDPModule``, over the rank's
replicas):

* ``meta``: per module, the compression's ``state_dict()`` without its tensors (codec, options,
  step, the memory's counters) and which keys each store holds (dtype and device);
* one ``[K, N]`` float32 per memory store (``residuals``; DGC's ``velocities`` and
  ``accumulations``), N the rank's shard of every module (the worker memory is keyed by parameter
  and is the size of the shard), each parameter at a fixed slot from the modules' layouts;
* ``owner_residuals`` ``[K, N]`` when the memory keeps residuals (error feedback on): the
  two-phase pattern's owner residuals (keys ``"<parameter>[<replica>]"``, the stripes of the shard
  this rank owns among its replicas, less than N values in all), at offsets recorded in ``meta``.

Loading needs the same world size and the same split into nodes (the same ranks in each node):
another split of another shape fails in ``dcp.load`` on the layout piece, on every rank, with DCP's
size mismatch naming both (:mod:`horovod_gradcomp.fsdp.checkpoint`); one of the same shape made of
other ranks gets a ``ValueError`` naming both, on every rank.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .checkpoint import Slots, memory_stores, mesh_device, meta_capacity, pack, read_rows, unpack, write_rows

OWNER = "owner_residuals"


def _slots(state) -> Tuple[Slots, int]:
    """Offset and shape of every module's worker memory key (a parameter's shard), and the total."""
    slots, offset = {}, 0
    for hook in state.hooks:
        for seg in hook.layout.segments:
            slots[seg.name] = (offset, seg.shape)
            offset += seg.numel
    return slots, offset


def _keeps_owner_residuals(state) -> bool:
    return any(h.compression.state.owner_memory.enabled for h in state.hooks)


def _pieces(state):
    return [*memory_stores(state.hooks[0].compression.state.memory), *([OWNER] if _keeps_owner_residuals(state) else [])]


def _owner(state) -> str:
    return f"hgc.fsdp HSDP ({state.codec.name}) checkpoint"


def _meta_capacity(state, slots: Slots) -> int:
    """The ``meta`` row's size, the same when saving and loading."""
    return meta_capacity(len(state.hooks), 2 * len(slots))


def hsdp_state_dict(state) -> dict:
    """This rank's row of every piece (see the module doc); a collective-free call."""
    owner = _owner(state)
    slots, total = _slots(state)
    device = mesh_device(state.mesh)
    flats = {p: torch.zeros(total, dtype=torch.float32, device=device) for p in _pieces(state)}
    owner_slots: Slots = {}
    owner_offset = 0
    modules = {}
    for hook in state.hooks:
        full = hook.compression.state_dict()
        memory_state = dict(full.get("memory_state") or {})
        stores = {}
        for store in memory_stores(hook.compression.state.memory):
            stores[store] = pack(flats[store], dict(memory_state.get(store) or {}), slots, owner, store)
            memory_state[store] = {}
        owner_state = dict(full["owner_memory"])
        owned = dict(owner_state.get("residuals") or {})
        if owned:
            for key, tensor in owned.items():
                if owner_offset + tensor.numel() > total:
                    raise ValueError(f"{owner}: the owner residuals take more than the {total} values of the shard")
                owner_slots[key] = (owner_offset, tensor.shape)
                owner_offset += tensor.numel()
            stores[OWNER] = pack(flats[OWNER], owned, owner_slots, owner, OWNER)
        owner_state["residuals"] = {}
        modules[hook.module] = {**full, "memory_state": memory_state, "owner_memory": owner_state, "stores": stores}
    meta = {"modules": modules,
            "owner_slots": {key: [offset, list(shape)] for key, (offset, shape) in owner_slots.items()}}
    return write_rows(state.mesh, state.rank, state.nodes, meta, _meta_capacity(state, slots), flats, owner)


def load_hsdp_state_dict(state, saved: dict) -> None:
    """Restore this rank's row of :func:`hsdp_state_dict`'s pieces (as ``dcp.load`` filled them)."""
    owner = _owner(state)
    slots, total = _slots(state)
    meta, local = read_rows(saved, _pieces(state), state.rank, state.nodes, _meta_capacity(state, slots), owner,
                            "an HSDPCompressionState of this codec")
    modules = dict(meta["modules"])
    if sorted(modules) != sorted(h.module for h in state.hooks):
        raise ValueError(f"{owner}: the checkpoint holds the modules {sorted(modules)}, this model registered "
                         f"{sorted(h.module for h in state.hooks)} (another model?)")
    owner_slots: Slots = {}
    for key, (offset, shape) in dict(meta["owner_slots"]).items():
        shape = torch.Size(shape)
        if not 0 <= offset <= offset + shape.numel() <= total:
            raise ValueError(f"{owner}: the owner residual {key!r} lies outside the {total} values of the row")
        owner_slots[key] = (int(offset), shape)
    for hook in state.hooks:
        full = dict(modules[hook.module])
        stores = dict(full.pop("stores"))
        memory_state = dict(full["memory_state"])
        owner_state = dict(full["owner_memory"])
        for store, entries in stores.items():
            if store == OWNER:
                owner_state["residuals"] = unpack(local(saved[OWNER]), entries, owner_slots, owner, OWNER)
            else:
                memory_state[store] = unpack(local(saved[store]), entries, slots, owner, store)
        hook.compression.load_state_dict({**full, "memory_state": memory_state, "owner_memory": owner_state})
