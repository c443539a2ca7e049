"""The allgather pattern: every rank sends its whole payload to every other rank.

Per rank and exchange this sends (K-1) x S bytes for a payload of S bytes, so it stops
paying when K approaches twice the compression ratio (see :mod:`horovod_gradcomp.exchange.two_phase`
for the pattern whose traffic stays flat in K). Each gradient is encoded through this rank's
memory (error feedback or DGC) from stream position ``step * P + i``; fixed-size payloads then
travel in one allgather of the fused buffer, variable-size ones (``codec.variable_size``) in an
allgather of the sizes and an allgatherv; every rank decodes the mean of the K payloads.

With ``chunk_bytes`` and a driver that can keep a collective in flight, a bucket of fixed-size
payloads larger than one chunk is pipelined (:mod:`horovod_gradcomp.exchange.pipeline`): one
allgather per chunk; the bytes sent and the results are the same as in one allgather.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..codecs.base import Codec, Payload
from .bucket import BoundedCache, Bucket, BucketOutcome
from .scale_agreement import agree_scales
from .stream_positions import StepPositions
from .nonfinite_check import EncodesWholeTensors, nonfinite_payloads
from .fusion import FusedLayout, pack_variable, unpack_variable
from .pipeline import ChunkPlanner
from .requests import Collective, Issue, Steps, Wait
from .stats import ExchangeStats, StepTotals, allgather_wire_bytes


class AllgatherPattern(EncodesWholeTensors):
    """Fields: codec; chunker (the pipelined chunks of a bucket, :class:`~horovod_gradcomp.exchange.pipeline.ChunkPlanner`);
    a cache of fused layouts by bucket (buckets rarely change). :meth:`steps` is the exchange."""

    name = "allgather"

    def __init__(self, codec: Codec, chunk_bytes: Optional[int] = None):
        self.codec = codec
        self.chunker = ChunkPlanner(codec, chunk_bytes)
        self._layouts = BoundedCache(64)

    def memory_keys(self, names: Sequence[str], rank: int) -> Tuple[List[str], List[str]]:
        """(worker, owner) memory keys a bucket may change (:mod:`.patterns`): the tensors' own; no owner keys."""
        return list(names), []

    def layout(self, names: Sequence[str], pending: Mapping[str, Payload]) -> FusedLayout:
        entries = tuple((n, tuple(pending[n].shape), pending[n].dtype) for n in names)
        return self._layouts.get_or_make(entries, lambda: FusedLayout(self.codec, entries))

    def steps(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals, overlap: bool = False) -> Steps:
        """Encode, exchange and decode ``bucket``, as a request sequence (:mod:`.requests`; every
        rank runs it with the same names). ``overlap``: the driver can keep a collective in flight
        while this one encodes: a bucket of several chunks is then pipelined (chunk i's allgather
        issued, chunk i+1 encoded meanwhile, each chunk decoded as soon as its bytes are in)."""
        memory, grads = bucket.state.memory, bucket.grads
        options = dict(zip(bucket.names, (yield from agree_scales(
            self.codec, comm, bucket.names, lambda: [memory.compensated(n, grads[n]) for n in bucket.names], stats,
            totals, bucket.measured))))
        if self.codec.variable_size:
            return (yield from self._variable(comm, bucket, options, stats))
        chunks = self.chunker.chunks([(n, bucket.grads[n].shape, bucket.grads[n].dtype) for n in bucket.names],
                                     comm.size) if overlap else None
        names_of = [[n for n, _, _ in chunk] for chunk in chunks] if chunks is not None else [list(bucket.names)]
        results, payload, nonfinite, inflight = {}, 0, [], deque()

        def decode(layout: FusedLayout, devices, recv) -> None:
            with stats.timed("decode_s"):
                nonfinite.append(self.decode_stacked(layout.unpack(recv, devices), bucket, results))

        for c, names in enumerate(names_of):
            last = c == len(names_of) - 1
            pending = self.encode_names(bucket, names, options, stats)
            layout, devices = self.layout(names, pending), {n: pending[n].device for n in names}
            with stats.timed("exchange_s"):
                send = layout.pack(pending, comm=comm)
            payload += layout.nbytes
            call = Collective("allgather", (send,), comm, "payload", last=last)
            if chunks is None:
                decode(layout, devices, (yield call))
                continue
            inflight.append((layout, devices, (yield Issue(call))))
            while inflight and (inflight[0][2].done() or last):
                layout, devices, handle = inflight.popleft()
                decode(layout, devices, (yield Wait(handle)))
        return BucketOutcome(results, payload, allgather_wire_bytes(payload, comm.size), nonfinite=any(nonfinite))

    def _variable(self, comm, bucket: Bucket, options: Mapping[str, dict], stats: ExchangeStats) -> Steps:
        """Variable-size payloads: one allgatherv of every rank's serialized part (sizes unknown)."""
        names = bucket.names
        pending = self.encode_names(bucket, names, options, stats)
        with stats.timed("exchange_s"):
            send = pack_variable(names, pending, comm)
        parts = yield Collective("allgatherv", (send,), comm, "payload", last=True)
        results = {}
        with stats.timed("decode_s"):
            nonfinite = self.decode_lists([unpack_variable(part, names, pending) for part in parts], bucket, results)
        return BucketOutcome(results, send.numel(), allgather_wire_bytes(send.numel() + 8, comm.size),
                             nonfinite=nonfinite)

    def decode_stacked(self, unpacked, bucket: Bucket, results: Dict[str, object]) -> bool:
        """The mean over ranks of each (name, stacked payloads) of ``unpacked`` into ``results``
        (one bucket op of the codec where it has one). Returns whether a payload showed
        non-finite input (looked at only where ``bucket.check_payloads``)."""
        unpacked = list(unpacked)
        names = [n for n, _ in unpacked]
        stacked = [s for _, s in unpacked]
        nonfinite = bucket.check_payloads and nonfinite_payloads(self.codec, stacked)
        means = self.codec.decode_mean_stacked_many(stacked, outs=[bucket.outs.get(n) for n in names])
        results.update(zip(names, means))
        return nonfinite

    def decode_lists(self, decoded: List[Dict[str, Payload]], bucket: Bucket, results: Dict[str, object]) -> bool:
        """The mean over ranks of each name's K variable-size payloads (``decoded``: one dict per
        rank) into ``results``; returns whether a payload showed non-finite input (as
        :meth:`decode_stacked`)."""
        names = bucket.names
        nonfinite = bucket.check_payloads and any(nonfinite_payloads(self.codec, d.values()) for d in decoded)
        means = self.codec.decode_mean_list_many([[d[n] for d in decoded] for n in names],
                                                 outs=[bucket.outs.get(n) for n in names])
        results.update(zip(names, means))
        return nonfinite

    def encode_names(self, bucket: Bucket, names: Sequence[str], options: Mapping[str, dict],
                     stats: ExchangeStats) -> Dict[str, Payload]:
        """``names``' gradients through this rank's memory, each from its stream position."""
        memory, grads = bucket.state.memory, bucket.grads
        positions = StepPositions(bucket.state.step, bucket.order)
        with stats.timed("encode_s"):
            payloads = memory.encode_many(self.codec, names, [grads[n] for n in names], [options[n] for n in names],
                                          [positions(n) for n in names])
        return dict(zip(names, payloads))



__all__ = ["AllgatherPattern"]
