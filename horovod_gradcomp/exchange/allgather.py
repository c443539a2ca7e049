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
from .scale_agreement import agree_scales, with_measured
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
        while this one encodes: a bucket of several chunks is then pipelined."""
        chunks = self.chunker.chunks([(n, bucket.grads[n].shape, bucket.grads[n].dtype) for n in bucket.names],
                                     comm.size)
        if chunks is not None and overlap:
            return (yield from self._pipelined(comm, bucket, chunks, stats, totals))
        pending = self.encode_names(bucket, bucket.names, (yield from self.agree(comm, bucket, stats, totals)), stats)
        names, codec = bucket.names, self.codec
        results = {}
        if codec.variable_size:
            with stats.timed("exchange_s"):
                send = pack_variable(names, pending, comm)
            parts = yield Collective("allgatherv", (send,), comm, "payload", last=True)
            payload, extra = send.numel(), 8
            with stats.timed("decode_s"):
                decoded = [unpack_variable(part, names, pending) for part in parts]
                nonfinite = self.decode_lists(decoded, bucket, results)
        else:
            layout = self.layout(names, pending)
            with stats.timed("exchange_s"):
                send = layout.pack(pending, comm=comm)
            recv = yield Collective("allgather", (send,), comm, "payload", last=True)
            payload, extra = layout.nbytes, 0
            with stats.timed("decode_s"):
                nonfinite = self.decode_stacked(layout.unpack(recv, {n: pending[n].device for n in names}), bucket,
                                                results)
        return BucketOutcome(results, payload, allgather_wire_bytes(payload + extra, comm.size), nonfinite=nonfinite)

    def _pipelined(self, comm, bucket: Bucket, chunks: List[list], stats: ExchangeStats, totals: StepTotals) -> Steps:
        """The fixed-size exchange chunk by chunk: chunk i's allgather issued, chunk i+1 encoded
        meanwhile; each chunk decoded as soon as its bytes are in (at the latest, at the end)."""
        options = yield from self.agree(comm, bucket, stats, totals)
        results, payload = {}, 0
        nonfinite = []
        inflight: deque = deque()
        for c, chunk in enumerate(chunks):
            names = [n for n, _, _ in chunk]
            pending = self.encode_names(bucket, names, options, stats)
            layout = self.layout(names, pending)
            with stats.timed("exchange_s"):
                send = layout.pack(pending, comm=comm)
            inflight.append((layout, (yield Issue(Collective("allgather", (send,), comm, "payload",
                                                                 last=c == len(chunks) - 1)))))
            payload += layout.nbytes
            while inflight and (inflight[0][1].done() or c == len(chunks) - 1):
                layout, handle = inflight.popleft()
                recv = yield Wait(handle)
                with stats.timed("decode_s"):
                    devices = {n: bucket.grads[n].device for n, _, _ in layout.entries}
                    nonfinite.append(self.decode_stacked(layout.unpack(recv, devices), bucket, results))
        return BucketOutcome(results, payload, allgather_wire_bytes(payload, comm.size), nonfinite=any(nonfinite))

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

    def agree(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals) -> Steps:
        """name -> encode options (a request sequence): the shared scales agreed over ranks when
        the codec has them (one collective for the whole bucket; the local scales measured before
        the preamble where they were), ``{}`` otherwise; plus what the bucket's check measured
        (onebit's scales)."""
        memory, names, grads, measured = bucket.state.memory, bucket.names, bucket.grads, bucket.measured
        options = yield from agree_scales(
            self.codec, comm, len(names), lambda: [memory.compensated(n, grads[n]) for n in names], stats, totals,
            local=measured.local_for(names) if measured is not None else None)
        return dict(zip(names, with_measured(options, names, measured)))

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
