"""The hierarchical pattern: dense inside a node, the codec between nodes, every local rank an owner.

A job of N nodes of L ranks each (:mod:`horovod_gradcomp.exchange.topology`). Each tensor of a
bucket is cut into L stripes (:mod:`horovod_gradcomp.exchange.stripes`, the axis chosen as the
two-phase pattern chooses it, :func:`~horovod_gradcomp.exchange.two_phase.choose_axis`, with L
owners; rows for variable-size codecs); shard l of the bucket is stripe l of every tensor. One bucket, on every rank:

1. Node scatter (dense, inside the node): an alltoallv on the node's communicator sends local
   rank j stripe j of every gradient, as float32 (float64 for float64 gradients). Local rank l
   adds the L stripes it receives in local-rank order in that type and divides by L: the node's
   mean of shard l, cast to the gradient's dtype (:meth:`HierarchicalPattern.node_means`).
2. Between nodes: the node means of shard l, one tensor per stripe (keys ``shard_key(name, l)``),
   form a bucket that the codec's own pattern exchanges among the ranks with local rank l, one
   per node (the ``peers`` communicator, N ranks): :class:`~horovod_gradcomp.exchange.allgather.AllgatherPattern`
   or :class:`~horovod_gradcomp.exchange.two_phase.TwoPhasePattern` (``inner``: either, or
   ``"auto"``, the flat rule of :meth:`~horovod_gradcomp.exchange.engine.StepEngine.flat_auto`
   with K = N), unchanged: its error feedback (or DGC memory) is this rank's state keyed by the
   shard keys (the shard's owner keeps it; checkpointed with the state), its stream positions
   count P x L shard keys (index ``i * L + l`` for the tensor of sorted index i), its encodes
   draw from this rank's own codec stream. Every peer ends with bitwise the same mean over the
   N nodes of shard l: the mean over all K ranks.
3. Node gather (dense, inside the node): an allgatherv on the node's communicator of every
   local rank's decoded shard (in the gradient's dtype); every rank writes each stripe into its
   place of the results. Every rank of the job thus holds bitwise the same result.

Traffic per rank (a bucket of B dense bytes, payload S): 2 (L-1)/L B inside the node, what the
inner pattern sends for S/L between nodes; the table: docs/guide/multi_gpu_nodes.md.

The engine keeps everything else as on the flat path (the preamble over all K ranks, its
signature naming the layout; snapshots of the shard keys' memory, :meth:`memory_keys`). Codec
options that need the whole of one rank's gradient are refused: DGC's ``clip_norm``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .bucket import BoundedCache, Bucket, BucketOutcome, result_tensor
from .dense import mean_in_rank_order
from .requests import Collective, Steps, passed_on
from .stats import ExchangeStats, StepTotals
from .stripes import Stripe, stripe_key, stripes
from .two_phase import choose_axis

INNER_PATTERNS = ("auto", "allgather", "two_phase")


def shard_key(name: str, local: int) -> str:
    """The key of shard ``local`` (stripe ``local`` of L) of tensor ``name``: in the inner bucket,
    the memory and the checkpoint."""
    return f"{name}<node shard {local}>"


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dense steps' type: float64 for float64 gradients, float32 for every other dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class NodeWork:
    """One bucket between the steps (fields filled step by step).

    Fields: names; shards (name -> its L stripes); mine (this rank's non-empty stripes, in name
    order, as (name, stripe)); send, send_counts, recv_counts (the node scatter's alltoallv);
    outcome (what the inner pattern returned for the node means)."""
    names: List[str]
    shards: Dict[str, List[Stripe]]
    mine: List[Tuple[str, Stripe]]
    send: torch.Tensor
    send_counts: List[int]
    recv_counts: List[int]
    outcome: Optional[BucketOutcome] = None


class HierarchicalPattern:
    """The node-then-peers exchange (see the module doc).

    Fields: codec; inner ("auto" | "allgather" | "two_phase"); patterns (the engine's flat
    pattern objects, name -> pattern: the inner exchange is theirs); choose (the flat auto
    rule: ``choose(grads, k)`` -> pattern name); node, peers (the two sub-communicators, set by
    :meth:`connect`); layout (:class:`~horovod_gradcomp.exchange.topology.Layout`)."""

    name = "hierarchical"

    def __init__(self, codec, patterns: Mapping[str, object], choose: Callable[[Mapping[str, torch.Tensor], int], str],
                 inner: str = "auto"):
        if inner not in INNER_PATTERNS:
            raise ValueError(f"hierarchical exchange: inner_pattern must be one of {INNER_PATTERNS}, got {inner!r}")
        if inner == "two_phase" and "two_phase" not in patterns:
            raise ValueError(f"hierarchical exchange: inner_pattern='two_phase' needs a fixed-size codec with error "
                             f"feedback (as pattern='two_phase' does), not {codec!r}")
        self.codec, self.inner, self.patterns, self.choose = codec, inner, patterns, choose
        self.layout = None
        self.node = self.peers = None
        self._orders, self._shards = BoundedCache(8), BoundedCache(1024)

    def connect(self, layout, node, peers) -> None:
        """Use ``layout`` and its sub-communicators (``node``: this node's ranks; ``peers``: this
        local rank's, one per node)."""
        self.layout, self.node, self.peers = layout, node, peers

    @property
    def ranks_per_node(self) -> int:
        return self.node.size

    def shards(self, shape: Sequence[int], dtype: torch.dtype) -> List[Stripe]:
        """The L stripes of a tensor: the two-phase pattern's axis rule with L owners (rows for a
        variable-size codec, which has no fixed payload size to compare). Cached."""
        L = self.ranks_per_node

        def cut() -> List[Stripe]:
            return stripes(shape, L, "rows" if self.codec.variable_size else choose_axis(self.codec, shape, dtype, L))
        return self._shards.get_or_make((tuple(shape), dtype, L), cut)

    def memory_keys(self, names: Sequence[str], rank: int) -> Tuple[List[str], List[str]]:
        """(worker, owner) memory keys a bucket may change (:mod:`.patterns`): this rank's shard
        keys, and the inner two-phase owner keys of those."""
        local, node = self.node.rank, self.peers.rank
        keys = [shard_key(n, local) for n in names]
        return keys, [stripe_key(k, node) for k in keys]

    def order(self, order: Mapping[str, int]) -> Dict[str, int]:
        """Shard key -> index ``i * L + l`` (i: the tensor's index in ``order``): the stream
        positions of the inner exchange (P x L keys)."""
        L = self.ranks_per_node
        return self._orders.get_or_make((id(order), len(order), L),
                                        lambda: {shard_key(n, l): i * L + l for n, i in order.items() for l in range(L)})

    # -- the three steps (the request sequence, :meth:`steps`, runs them around its collectives) --
    def scatter(self, bucket: Bucket, stats: ExchangeStats) -> NodeWork:
        """Step 1's send side: ``(send, send_counts, recv_counts)`` of the node alltoallv in a
        :class:`NodeWork` (segment j: stripe j of every gradient, in the wire dtype)."""
        L, local = self.ranks_per_node, self.node.rank
        names, grads = bucket.names, bucket.grads
        shards = {n: self.shards(tuple(grads[n].shape), grads[n].dtype) for n in names}
        with stats.timed("exchange_s", phase="node_scatter"):
            counts = [sum(shards[n][j].numel * _itemsize(wire_dtype(grads[n].dtype)) for n in names)
                      for j in range(L)]
            if L == 1:   # one rank per node: nothing to send, node_means takes the gradients themselves
                send = torch.empty(0, dtype=torch.uint8)
            else:
                send, offset = torch.empty(sum(counts), dtype=torch.uint8), 0
                for j in range(L):
                    for n in names:
                        st = shards[n][j]
                        if st.numel:
                            offset = _copy_in(send, offset, st.window(grads[n].detach()), wire_dtype(grads[n].dtype))
        mine = [(n, shards[n][local]) for n in names if shards[n][local].numel]
        mine_bytes = sum(st.numel * _itemsize(wire_dtype(grads[n].dtype)) for n, st in mine)
        return NodeWork(list(names), shards, mine, send, counts, [mine_bytes] * L)

    def node_means(self, work: NodeWork, recv: torch.Tensor, bucket: Bucket, stats: ExchangeStats) -> Bucket:
        """Step 1's receive side: the node's mean of each of this rank's stripes (the L received
        segments added in local-rank order in the wire dtype, divided by L, cast to the gradient's
        dtype), as the inner pattern's :class:`Bucket`."""
        L, local, grads = self.ranks_per_node, self.node.rank, bucket.grads
        per_rank = work.recv_counts[0]
        with stats.timed("decode_s", phase="node_sum"):
            means, offset = {}, 0
            for n, st in work.mine:
                if L == 1:   # the node's mean is the gradient itself (a view)
                    means[shard_key(n, local)] = st.take(grads[n].detach())
                    continue
                dt = wire_dtype(grads[n].dtype)
                nbytes = st.numel * _itemsize(dt)
                total = mean_in_rank_order([_typed(recv[j * per_rank + offset: j * per_rank + offset + nbytes], dt)
                                            for j in range(L)])   # local-rank order: the same on every peer
                means[shard_key(n, local)] = total.to(grads[n].dtype).view(st.shape).to(grads[n].device)
                offset += nbytes
        return Bucket(list(means), means, bucket.state, self.order(bucket.order), {}, None)

    def inner_pattern(self, inner: Bucket) -> object:
        """The flat pattern object that exchanges ``inner`` among the N peers (the same on every
        rank: it depends on shapes and N only; an empty shard, a peer that owns no stripe,
        still takes part)."""
        name = self.inner
        if name == "auto":
            name = self.choose(inner.grads, self.peers.size)
        return self.patterns[name]

    def gather_args(self, work: NodeWork, bucket: Bucket, stats: ExchangeStats) -> Tuple[torch.Tensor, List[int]]:
        """Step 3's send side: this rank's decoded shard as bytes, and every local rank's count."""
        L, local, grads = self.ranks_per_node, self.node.rank, bucket.grads
        with stats.timed("exchange_s", phase="node_gather"):
            if L == 1:   # one rank per node: finish reads the decoded shards themselves
                part = torch.empty(0, dtype=torch.uint8)
            else:
                part = _as_bytes([work.outcome.results[shard_key(n, local)].reshape(-1).cpu() for n, _ in work.mine])
        counts = [sum(work.shards[n][j].numel * grads[n].element_size() for n in work.names) for j in range(L)]
        return part, counts

    def finish(self, work: NodeWork, gathered: Sequence[torch.Tensor], bucket: Bucket, stats: ExchangeStats
               ) -> BucketOutcome:
        """Step 3's receive side: every local rank's shard written into the results; the outcome
        with the inner pattern's payload, all bytes sent (``info["intra"]``: the two node steps'),
        and its non-finite flag."""
        grads, L = bucket.grads, self.ranks_per_node
        results = {n: result_tensor(grads[n], bucket.outs.get(n)) for n in work.names}
        with stats.timed("decode_s", phase="node_gather"):
            if L == 1:   # one rank per node: nothing was gathered, the decoded shards are the results
                for n, st in work.mine:
                    st.put(results[n], work.outcome.results[shard_key(n, 0)].to(results[n].device))
            else:
                for j in range(L):
                    buf, offset = gathered[j], 0
                    for n in work.names:
                        st = work.shards[n][j]
                        if not st.numel:
                            continue
                        nbytes = st.numel * grads[n].element_size()
                        value = _typed(buf[offset:offset + nbytes], grads[n].dtype).view(st.shape)
                        st.put(results[n], value.to(results[n].device))
                        offset += nbytes
        intra = float(sum(c for j, c in enumerate(work.send_counts) if j != self.node.rank)
                      + (L - 1) * len(gathered[self.node.rank])) if L > 1 else 0.0
        inner = work.outcome
        info = dict(inner.info, intra=intra, inter=inner.sent, nodes=self.peers.size, ranks_per_node=L)
        return BucketOutcome(results, inner.payload, inner.sent + intra, info, nonfinite=inner.nonfinite)

    def steps(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals, overlap: bool = False) -> Steps:
        """One bucket through the three steps (see the module doc), as a request sequence
        (:mod:`.requests`); ``comm`` (all K ranks) is not used: the node and peer communicators
        carry everything. The inner pattern's requests are passed on (none of them ``last``:
        the node gather follows); ``overlap`` is handed to it."""
        node = self.node
        work = self.scatter(bucket, stats)
        recv = work.send
        if node.size > 1:
            recv = yield Collective("alltoallv", (work.send, work.send_counts, work.recv_counts), node,
                                    "node_scatter", "node_scatter")
        inner = self.node_means(work, recv, bucket, stats)
        work.outcome = BucketOutcome({}, 0, 0.0)   # no stripe for this local rank: none for its peers either
        if inner.names:
            work.outcome = yield from passed_on(self.inner_pattern(inner).steps(self.peers, inner, stats, totals,
                                                                                overlap))
        part, counts = self.gather_args(work, bucket, stats)
        gathered = [part]
        if node.size > 1:
            gathered = yield Collective("allgatherv_known", (part, counts), node, "node_gather", "node_gather",
                                        last=True)
        return self.finish(work, gathered, bucket, stats)

    def __repr__(self) -> str:
        where = self.layout.describe() if self.layout is not None else "not connected"
        return f"HierarchicalPattern({self.codec!r}, inner={self.inner!r}, {where})"


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _typed(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bytes ``buf`` as ``dtype`` values: a view where the offset is aligned for it, else a copy
    (a bucket mixing element sizes)."""
    if buf.storage_offset() % _itemsize(dtype):
        buf = buf.clone()
    return buf.view(dtype)


def _copy_in(buf: torch.Tensor, offset: int, value: torch.Tensor, dtype: torch.dtype) -> int:
    """Write ``value`` (any device, dtype and strides) as ``dtype`` into the bytes of ``buf`` (host
    uint8) from ``offset``, in row-major order; returns the offset after it. One copy straight
    from the gradient where the offset is aligned for ``dtype`` (a bucket of one element size
    always is), else a converted copy first."""
    nbytes = value.numel() * _itemsize(dtype)
    dst = buf[offset:offset + nbytes]
    if offset % _itemsize(dtype) == 0:
        dst.view(dtype).view(value.shape).copy_(value)
    else:
        dst.copy_(value.to(device="cpu", dtype=dtype).contiguous().view(-1).view(torch.uint8))
    return offset + nbytes


def _as_bytes(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The flat tensors ``parts`` (host) back to back as one uint8 tensor."""
    if not parts:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat([p.contiguous().view(torch.uint8) for p in parts])


__all__ = ["HierarchicalPattern", "INNER_PATTERNS", "NodeWork", "shard_key", "wire_dtype"]
