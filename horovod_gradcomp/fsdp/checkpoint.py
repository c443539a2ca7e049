"""FSDP2 compression state as tensors for ``torch.distributed.checkpoint`` (DCP).

Both modes' states are DCP ``Stateful`` objects: put one next to the model and the optimizer and
``dcp.save`` / ``dcp.load`` write and restore it with them::

    dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "compression": state}, ...)

Every rank's compression state differs (its residuals remember what it failed to send), so each
piece is stored as a ``DTensor`` over a 1-D mesh of all K ranks of the job, of global shape
``[K, ...]`` and sharded on dim 0, each rank holding its own row: DCP writes each row once, from
its rank, and reads it back into the same rank. This module holds that machinery ("rows") and
sharded mode's use of it; HSDP mode's is :mod:`horovod_gradcomp.fsdp.hsdp_checkpoint`. The
pieces every state has:

* ``world_size``: ``[K]`` int64, row r holding r. Loading at another world size fails on this key
  first, on every rank, with DCP's "Size mismatch between saved torch.Size([K]) and current:
  torch.Size([K'])" for ``<name>.world_size`` (both sizes named; the state cannot be redistributed);
  :func:`read_rows` checks the size again with its own message, and the compression's own
  ``load_state_dict`` once more;
* ``layout_nodes_x_ranks_per_node``: ``[R, L]`` int64, the same on every rank (DCP writes it once):
  the job's ranks, node by node (a node: the ranks one FSDP2 module is sharded over; sharded mode
  is one "node" of all K ranks, ``[1, K]``; HSDP mode at R nodes of L ranks ``[R, L]``). It comes
  right after ``world_size``, so a checkpoint loaded at the same world size but another split into
  nodes (2 x 2 saved, 4 x 1 now; or saved in sharded mode and loaded in HSDP mode) fails on it
  first, on every rank, with DCP's "Size mismatch between saved torch.Size([2, 2]) and current:
  torch.Size([4, 1]) for <name>.layout_nodes_x_ranks_per_node", which names both layouts: DCP's
  planner compares every piece's size before any of this package's code sees the checkpoint, and
  the residual rows' sizes depend on the split, so the refusal cannot come later with other
  words. A split of the same shape made of other ranks (nodes ``[[0, 1], [2, 3]]`` saved,
  ``[[0, 2], [1, 3]]`` now) loads, and :func:`read_rows` then refuses it with a message naming both
  (:func:`describe_nodes`);
* ``meta``: ``[K, C]`` uint8 and ``meta_bytes`` ``[K, 1]``: everything that is not a memory
  tensor (codec, options, steps, the memory's counters, which keys each store holds, in which dtype
  and on which device), in :func:`~horovod_gradcomp.state.checkpoint_data.to_bytes`'s format and
  read back with ``weights_only=True`` (:func:`~horovod_gradcomp.state.checkpoint_data.from_bytes`);
  C is :func:`meta_capacity` bytes (64 KiB for small models);
* one ``[K, N]`` float32 per memory store (``residuals``; DGC's ``velocities`` and
  ``accumulations``), each tensor at a fixed offset ("slot") computed from the modules' layouts.
  Float32 holds fp32, bf16 and fp16 values exactly; fp64 residuals are refused.

In sharded mode N is every segment of every chunk of every module, keys ``"<parameter>[<chunk>]"``.

Nothing is unpickled: DCP reads tensors only (no ``bytes`` items, which its loader would read with
``torch.load(weights_only=False)``).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Sequence, Tuple

import torch

from ..state.checkpoint_data import from_bytes, to_bytes

#: The least bytes reserved per rank for the non-tensor part of the state (:func:`meta_capacity`).
META_CAPACITY = 1 << 16
_EXACT = (torch.float32, torch.bfloat16, torch.float16)

#: key -> (offset, shape) in a store's flat row.
Slots = Dict[str, Tuple[int, torch.Size]]


def meta_capacity(compressions: int, keys: int) -> int:
    """Bytes of the ``meta`` row of a state of ``compressions`` compressions (their codec, options and
    counters: 4 KiB each) and ``keys`` memory keys (their names, dtypes and devices in every store:
    512 bytes each), at least :data:`META_CAPACITY`; computed from the layouts, the same at save and
    load. (A 6-block transformer at K = 4 under DGC, 312 keys, takes 47,725 bytes.)"""
    return max(META_CAPACITY, 4096 * compressions + 512 * keys)


def _slots(state) -> Tuple[Slots, int]:
    """Sharded mode: offset and shape of every memory key in the flat store tensors, and their total length."""
    slots, offset = {}, 0
    for comm in state.comms:
        for j in range(comm.layout.world_size):
            for seg, key in zip(comm.layout.segments, comm.layout.keys(j)):
                slots[key] = (offset, seg.shape)
                offset += seg.numel
    return slots, offset


def mesh_device(mesh) -> torch.device:
    """The device of ``mesh``'s rows on this rank (the current device of its device type)."""
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, getattr(torch, mesh.device_type).current_device())


def _rows(mesh, local: torch.Tensor, row: bool = True):
    """``local`` as this rank's row (``row``) or element of a DTensor sharded on dim 0 over ``mesh``."""
    from torch.distributed.tensor import DTensor, Shard
    return DTensor.from_local(local.unsqueeze(0) if row else local, mesh, [Shard(0)], run_check=False)


def memory_stores(memory) -> List[str]:
    """The memory's tensor stores (:meth:`~horovod_gradcomp.state.memory.Memory.stores`), each
    saved as one flat tensor."""
    return list(memory.stores())


def pack(flat: torch.Tensor, tensors: Mapping[str, torch.Tensor], slots: Slots, owner: str,
         store: str) -> Dict[str, List[str]]:
    """Copy every tensor of ``tensors`` into its slot of ``flat``; returns what :func:`unpack` needs
    to rebuild them: key -> ``[dtype, device]``. Raises ValueError for a key without a slot and
    NotImplementedError for a dtype float32 cannot hold exactly."""
    entries = {}
    for key, tensor in tensors.items():
        if key not in slots:
            raise ValueError(f"{owner}: the {store} hold {key!r}, which no registered module's layout has")
        if tensor.dtype not in _EXACT:
            raise NotImplementedError(f"{owner}: {store} {key!r} is {tensor.dtype}; the checkpoint stores "
                                      "float32, bf16 and fp16 state exactly, not this dtype")
        offset, shape = slots[key]
        if tensor.numel() != shape.numel():
            raise ValueError(f"{owner}: {store} {key!r} has {tensor.numel()} values, its slot {shape.numel()}")
        flat[offset: offset + shape.numel()].copy_(tensor.reshape(-1))
        entries[key] = [str(tensor.dtype).replace("torch.", ""), str(tensor.device)]
    return entries


def unpack(flat: torch.Tensor, entries: Mapping[str, Sequence[str]], slots: Slots, owner: str,
           store: str) -> Dict[str, torch.Tensor]:
    """The tensors :func:`pack` wrote into ``flat`` (copies, in their saved dtype and device)."""
    tensors = {}
    for key, (dtype, device) in entries.items():
        if key not in slots:
            raise ValueError(f"{owner}: the checkpoint's {store} hold {key!r}, which no registered module's "
                             "layout has (another model?)")
        offset, shape = slots[key]
        tensors[key] = flat[offset: offset + shape.numel()].reshape(shape).to(
            device=torch.device(device), dtype=getattr(torch, dtype), copy=True)
    return tensors


#: The piece holding the job's split into nodes (see the module doc).
LAYOUT = "layout_nodes_x_ranks_per_node"


def describe_nodes(nodes: Sequence[Sequence[int]]) -> str:
    """``nodes`` (the ranks of each node) in words: "2 nodes x 2 ranks (nodes [[0, 1], [2, 3]])"."""
    rows = [list(map(int, n)) for n in nodes]
    return (f"{len(rows)} node{'s' if len(rows) != 1 else ''} x {len(rows[0]) if rows else 0} ranks "
            f"(nodes {rows})")


def write_rows(mesh, rank: int, nodes: Sequence[Sequence[int]], meta: dict, capacity: int,
               flats: Mapping[str, torch.Tensor], owner: str) -> dict:
    """The pieces of one rank (see the module doc): ``world_size``, the layout piece (``nodes``:
    the ranks of every node, in node order), ``meta`` (``meta`` in ``capacity`` bytes; ValueError
    when it needs more) and ``meta_bytes``, then ``flats`` by name."""
    device = mesh_device(mesh)
    data = to_bytes(meta)
    if data.numel() > capacity:
        raise ValueError(f"{owner}: the state's non-tensor part takes {data.numel()} bytes, more than the "
                         f"{capacity} reserved for it")
    padded = torch.zeros(capacity, dtype=torch.uint8, device=device)
    padded[: data.numel()].copy_(data)
    out = {"world_size": _rows(mesh, torch.tensor([rank], dtype=torch.int64, device=device), row=False),
           LAYOUT: torch.tensor([list(map(int, n)) for n in nodes], dtype=torch.int64),
           "meta": _rows(mesh, padded),
           "meta_bytes": _rows(mesh, torch.tensor([data.numel()], dtype=torch.int64, device=device))}
    for name, flat in flats.items():
        out[name] = _rows(mesh, flat)
    return out


def read_rows(saved: Mapping, pieces: Sequence[str], rank: int, nodes: Sequence[Sequence[int]], capacity: int,
              owner: str, writer: str) -> Tuple[dict, Callable]:
    """This rank's ``meta`` of :func:`write_rows`'s pieces as ``dcp.load`` filled them, and a function
    giving this rank's row of a piece. ``nodes``: this job's ranks, node by node. Raises ValueError
    when a piece is missing (``writer``: what writes them), when the checkpoint has another number
    of ranks or another split into nodes (naming both) or a bad meta size."""
    world = sum(len(n) for n in nodes)
    missing = [p for p in ("world_size", LAYOUT, "meta", "meta_bytes", *pieces) if p not in saved]
    if missing:
        raise ValueError(f"{owner}: the checkpoint lacks {missing}: it was not written by {writer}")
    rows = int(saved["world_size"].shape[0])
    if rows != world:
        raise ValueError(f"{owner}: this checkpoint was written by a job of {rows} ranks; this job has {world}. "
                         "The compression state (each rank's residuals) cannot be redistributed "
                         "to another number of ranks: start it fresh instead (do not load it)")
    saved_nodes = saved[LAYOUT].tolist()
    if saved_nodes != [list(map(int, n)) for n in nodes]:
        raise ValueError(f"{owner}: this checkpoint was written by a job of {describe_nodes(saved_nodes)}; this job "
                         f"has {describe_nodes(nodes)}. Each rank's residuals are of its own shard and replicas: "
                         "start the compression state fresh instead (do not load it)")

    def local(piece):
        return piece.to_local()[0] if hasattr(piece, "to_local") else piece[rank]

    n = int(local(saved["meta_bytes"]).reshape(-1)[0])
    if not 0 < n <= capacity:
        raise ValueError(f"{owner}: the checkpoint's state part has {n} bytes (expected 1..{capacity})")
    return from_bytes(local(saved["meta"])[:n], f"{owner}: rank {rank}'s state"), local


def _owner(state) -> str:
    return f"hgc.fsdp ({state.codec.name}) checkpoint"


def dcp_state_dict(state) -> dict:
    """Sharded mode: this rank's row of every piece (see the module doc); a collective-free call."""
    owner = _owner(state)
    slots, total = _slots(state)
    device = mesh_device(state.mesh)
    full = state.compression.state_dict()
    memory_state = dict(full.get("memory_state") or {})
    flats, layout = {}, {}
    for store in memory_stores(state.memory):
        flats[store] = torch.zeros(total, dtype=torch.float32, device=device)
        layout[store] = pack(flats[store], dict(memory_state.get(store) or {}), slots, owner, store)
        memory_state[store] = {}
    meta = {**full, "memory_state": memory_state, "stores": layout}
    return write_rows(state.mesh, state.communicator.rank, state.nodes, meta, meta_capacity(1, len(slots)), flats,
                      owner)


def load_dcp_state_dict(state, saved: dict) -> None:
    """Sharded mode: restore this rank's row of :func:`dcp_state_dict`'s pieces (as ``dcp.load`` filled them)."""
    owner = _owner(state)
    stores = memory_stores(state.memory)
    slots, _ = _slots(state)
    full, local = read_rows(saved, stores, state.communicator.rank, state.nodes, meta_capacity(1, len(slots)), owner,
                            "an FSDPCompressionState of this codec")
    memory_state = dict(full["memory_state"])
    for store, entries in dict(full.pop("stores")).items():
        memory_state[store] = unpack(local(saved[store]), entries, slots, owner, store)
    state.compression.load_state_dict({**full, "memory_state": memory_state})
