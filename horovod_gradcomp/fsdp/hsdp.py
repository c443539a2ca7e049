"""HSDP mode: FSDP2 shards over the ranks of a node, the codec averages each shard across nodes.

The user shards every module over a 1-D mesh of the node's ranks (``fully_shard(..., mesh=
mesh_2d["shard"])``). FSDP2's own dense reduce-scatter then runs inside the node, and the module's
all-reduce hook (``set_all_reduce_hook``, which FSDP2 calls on the reduce-scatter's output with a
1-D mesh) averages the rank's shard with the shards of its replicas, the ranks at the same place
in the other nodes, through one ``hgc.Compression`` per module over the replicas' group: the same
engine, patterns (allgather, two-phase), error feedback, agreement and non-finite checks as the
Horovod path (``CodecCompression.exchange``), so every NIC carries 1/L of the node's traffic and
every replica decodes the same payloads in the same order (bitwise the same shard).

The memory here is the size of the rank's shard (the residuals of its own segments only; DGC's
velocities and accumulations the same), plus, for a module whose exchange takes the two-phase pattern
(three nodes or more), the owner residuals of the stripes of its shard that this rank owns among its
R replicas (about 1/R of the shard); ``stats()["memory_bytes"]`` counts them all.

Checkpoints: :class:`HSDPCompressionState` is a ``torch.distributed.checkpoint`` ``Stateful``
(:mod:`horovod_gradcomp.fsdp.hsdp_checkpoint`: same world size and layout only); the per-rank dict
of the Horovod path (every module's ``compression.state_dict()``) is ``state.per_rank.state_dict()``.
"""
from __future__ import annotations

from typing import Dict, List

import torch
import torch.distributed as dist

from ..exchange.reduce_scatter import ShardLayout


def replica_group(shard_group, owner: str):
    """The process group of this rank's replicas, and the nodes (every node's ranks, nodes sorted;
    the checkpoint's layout). Every rank calls it; it creates one group per place in the node, in
    the same order everywhere. Raises ValueError when the nodes' shard groups differ in size."""
    mine = dist.get_process_group_ranks(shard_group)
    every: List[List[int]] = [None] * dist.get_world_size()   # type: ignore[list-item]
    dist.all_gather_object(every, mine)
    nodes = sorted({tuple(g) for g in every})
    sizes = {len(n) for n in nodes}
    if len(sizes) != 1:
        raise ValueError(f"{owner}: HSDP needs shard groups of one size on every node, got {sorted(sizes)}")
    place = mine.index(dist.get_rank())
    chosen = None
    for p in range(sizes.pop()):
        ranks = [node[p] for node in nodes]
        group = dist.new_group(ranks=ranks, backend="gloo")
        if p == place:
            chosen = group
    return chosen, [list(n) for n in nodes]


def share_optimizer_momentum(compressions, params, optimizer, owner: str) -> None:
    """DGC with ``momentum=None`` in HSDP mode: the modules' compressions take the SGD's momentum
    together. Each compression's own check would hand it to one of them only (the first sets the
    SGD's momentum to 0, the others would read 0), so their checks are replaced by one
    :class:`~horovod_gradcomp.hvd_adapter.optimizer_check.PlainSGDGuard` over every parameter
    whose adoption sets every compression's momentum. With ``optimizer`` it runs at once (the
    momentum is in place for the first backward, and a checkpoint loaded afterwards keeps its
    own); otherwise before the first ``step()`` of an optimizer holding the parameters. Under a
    non-SGD optimizer DGC runs without momentum (one warning), as under Horovod and DDP."""
    from ..hvd_adapter.optimizer_check import PlainSGDGuard

    def adopt(momentum: float, nesterov: bool) -> None:
        for c in compressions:
            c.memory.adopt_momentum(momentum, nesterov)

    for c in compressions:
        c.optimizer_guard.remove()
    guard = PlainSGDGuard(params, owner=owner, adopt_momentum=adopt)
    for c in compressions:
        c.optimizer_guard = guard
    if optimizer is not None:
        guard.check(optimizer)


class ReplicaAverage:
    """The all-reduce hook of one module: its shard's segments averaged across the replicas by
    ``compression.exchange`` (results written back into the shard). Fields: compression, layout,
    module (its name)."""

    def __init__(self, compression, layout: ShardLayout, module: str):
        self.compression, self.layout, self.module = compression, layout, module

    def __call__(self, output: torch.Tensor) -> None:
        if output.numel() != self.layout.chunk_numel or not output.is_contiguous():
            raise ValueError(f"hgc.fsdp HSDP (module {self.module or '<root>'!r}): expected a contiguous shard of "
                             f"{self.layout.chunk_numel} values, got {tuple(output.shape)}")
        grads: Dict[str, torch.Tensor] = {s.name: v for s, v in zip(self.layout.segments,
                                                                    self.layout.views(output, 0))}
        results = self.compression.exchange(grads)
        for name, view in grads.items():   # exchange() writes into contiguous buffers; make sure
            if results[name].data_ptr() != view.data_ptr():
                view.copy_(results[name])


class HSDPCompressionState:
    """What :func:`~horovod_gradcomp.fsdp.register.register` returns in HSDP mode: one compression
    per module (over the replicas' group) and the counters.

    Fields: codec (the first module's; every module's has the same options), hooks (the modules'
    :class:`ReplicaAverage`, in model order), node_size (L, the ranks FSDP2 shards over),
    replicas (the number of nodes), nodes (every node's global ranks, in node order),
    world_size and rank (in the job), device_type (the modules' mesh's), per_rank
    (:class:`PerRankState`)."""

    mode = "hsdp"

    def __init__(self, hooks: List[ReplicaAverage], nodes: List[List[int]], device_type: str = "cpu"):
        self.hooks = hooks
        self.nodes = nodes
        node_size, replicas = len(nodes[0]), len(nodes)
        self.codec = hooks[0].compression.codec
        self.node_size, self.replicas = node_size, replicas
        self.world_size, self.rank = node_size * replicas, dist.get_rank()
        self.device_type = device_type
        self._mesh = None
        self.per_rank = PerRankState(hooks)
        self.bytes_reduce_scatter = 0.0
        self.calls = 0

    @property
    def mesh(self):
        """A 1-D ``DeviceMesh`` over the job's default process group (every rank): the checkpoint's
        rows. Made at its first use, from the existing group (no new group, no collective)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import DeviceMesh
            self._mesh = DeviceMesh.from_group(dist.group.WORLD, self.device_type)
        return self._mesh

    def count_reduce_scatter(self, hook: ReplicaAverage, output: torch.Tensor) -> None:
        """Count FSDP2's dense reduce-scatter inside the node that produced ``output``."""
        self.calls += 1
        self.bytes_reduce_scatter += (self.node_size - 1) * hook.layout.chunk_numel * output.element_size()

    def stats(self) -> dict:
        """``bytes_sent_replica`` (the codec's traffic between nodes, every module's compression
        summed: payloads, preambles, shared scales), ``bytes_sent_reduce_scatter`` (FSDP2's dense
        reduce-scatter inside the node, (L-1)/L of its input), ``bytes_sent`` (both), ``steps``
        (backward passes: the most any module exchanged), ``calls``, ``nonfinite_steps``,
        ``memory_bytes`` (every tensor of every module's compression state: the residuals, or DGC's
        velocities and accumulations, the size of the rank's shard each; and, where a module's
        exchange takes the two-phase pattern (three nodes or more), the owner residuals of the
        stripes of the shard this rank owns among its replicas, about 1/R of the shard),
        ``owner_memory_bytes`` (that last part alone) and the modules' own ``modules`` stats."""
        each = [h.compression.stats() for h in self.hooks]
        replica = sum(s["bytes_sent"] for s in each)
        steps = max(s["steps"] for s in each)
        memory = sum(h.compression.state.nbytes() for h in self.hooks)
        owner_memory = sum(h.compression.state.owner_nbytes() for h in self.hooks)
        total = replica + self.bytes_reduce_scatter
        return {"mode": "hsdp", "steps": steps, "calls": self.calls, "bytes_sent_replica": replica,
                "bytes_sent_reduce_scatter": self.bytes_reduce_scatter, "bytes_sent": total,
                "bytes_sent_per_step": total / steps if steps else 0.0,
                "bytes_sent_replica_per_step": replica / steps if steps else 0.0,
                "bytes_dense_replica": sum(s["bytes_dense"] for s in each),
                "nonfinite_steps": max(s["nonfinite_steps"] for s in each), "memory_bytes": memory,
                "owner_memory_bytes": owner_memory,
                "modules": {h.module: s for h, s in zip(self.hooks, each)}}

    def state_dict(self) -> dict:
        """This rank's compression state as DTensors over :attr:`mesh`, for ``dcp.save`` /
        ``dcp.load`` (a ``Stateful``; see :mod:`horovod_gradcomp.fsdp.hsdp_checkpoint`)."""
        from .hsdp_checkpoint import hsdp_state_dict
        return hsdp_state_dict(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (at the same world size and layout; ``ValueError`` naming both
        otherwise)."""
        from .hsdp_checkpoint import load_hsdp_state_dict
        load_hsdp_state_dict(self, state)

    def __repr__(self) -> str:
        return f"HSDPCompressionState({self.codec!r}, modules={len(self.hooks)}, {self.replicas} x {self.node_size})"


class PerRankState:
    """The per-rank form of HSDP mode's state (the Horovod path's: no DTensors), for checkpoints that
    hold one pickled object per rank (Accelerate's ``register_for_checkpointing``): ``state_dict()``
    is every module's ``compression.state_dict()`` by module name."""

    def __init__(self, hooks: List[ReplicaAverage]):
        self.hooks = hooks

    def state_dict(self) -> dict:
        return {h.module: h.compression.state_dict() for h in self.hooks}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` naming the modules when they differ."""
        missing = [h.module for h in self.hooks if h.module not in state]
        if missing:
            raise ValueError(f"hgc.fsdp HSDP: the checkpoint has no state for the modules {missing} (it holds "
                             f"{sorted(state)})")
        for h in self.hooks:
            h.compression.load_state_dict(state[h.module])


class CountingHook:
    """The hook FSDP2 calls: counts the node's reduce-scatter, then :class:`ReplicaAverage`."""

    def __init__(self, state: HSDPCompressionState, hook: ReplicaAverage):
        self.state, self.hook = state, hook

    def __call__(self, output: torch.Tensor) -> None:
        self.state.count_reduce_scatter(self.hook, output)
        self.hook(output)
