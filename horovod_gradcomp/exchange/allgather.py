"""The allgather pattern: every rank sends its whole payload to every other rank.

Per rank and exchange this sends (K-1) x S bytes for a payload of S bytes, so it stops
paying when K approaches twice the compression ratio (see :mod:`horovod_gradcomp.exchange.two_phase`
for the pattern whose traffic stays flat in K). Each gradient is encoded through this rank's
memory (error feedback or DGC) from stream position ``step * P + i``; fixed-size payloads then
travel in one allgather of the fused buffer, variable-size ones (``codec.variable_size``) in an
allgather of the sizes and an allgatherv; every rank decodes the mean of the K payloads.
"""
from __future__ import annotations

from typing import Dict, Mapping, Sequence

from ..codecs.base import Codec, Payload
from .bucket import Bucket, BucketOutcome
from .encoding import StepPositions, agree_scales
from .fusion import FusedLayout, pack_variable, unpack_variable
from .stats import ExchangeStats, StepTotals, allgather_wire_bytes


class AllgatherPattern:
    """Fields: codec; a cache of fused layouts by bucket (buckets rarely change)."""

    name = "allgather"

    def __init__(self, codec: Codec):
        self.codec = codec
        self._layouts: Dict[tuple, FusedLayout] = {}

    def layout(self, names: Sequence[str], pending: Mapping[str, Payload]) -> FusedLayout:
        entries = tuple((n, tuple(pending[n].shape), pending[n].dtype) for n in names)
        layout = self._layouts.get(entries)
        if layout is None:
            if len(self._layouts) >= 64:  # do not grow without bound
                self._layouts.clear()
            layout = self._layouts[entries] = FusedLayout(self.codec, entries)
        return layout

    def exchange(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals) -> BucketOutcome:
        """Encode, exchange and decode ``bucket`` (every rank calls it with the same names)."""
        pending = self.encode(comm, bucket, stats, totals)
        names, codec = bucket.names, self.codec
        results = {}
        if getattr(codec, "variable_size", False):
            with stats.timed("exchange_s"):
                send = pack_variable(names, pending)
                parts = comm.allgatherv(send)
            payload, extra = send.numel(), 8
            with stats.timed("decode_s"):
                decoded = [unpack_variable(part, names, pending) for part in parts]
                for n in names:
                    results[n] = codec.decode_mean_list([d[n] for d in decoded], out=bucket.outs.get(n))
        else:
            layout = self.layout(names, pending)
            with stats.timed("exchange_s"):
                recv = comm.allgather(layout.pack(pending))
            payload, extra = layout.nbytes, 0
            with stats.timed("decode_s"):
                devices = {n: pending[n].device for n in names}
                for name, stacked in layout.unpack(recv, devices):
                    results[name] = codec.decode_mean_stacked(stacked, out=bucket.outs.get(name))
        return BucketOutcome(results, payload, allgather_wire_bytes(payload + extra, comm.size))

    def encode(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals) -> Dict[str, Payload]:
        """Every gradient of the bucket through this rank's memory, each from its stream position,
        with the shared scales agreed first when the codec has them."""
        memory, names, grads = bucket.state.memory, bucket.names, bucket.grads
        options = agree_scales(self.codec, comm, len(names), lambda: [memory.compensated(n, grads[n]) for n in names],
                               stats, totals)
        positions = StepPositions(bucket.state.step, bucket.order)
        pending = {}
        with stats.timed("encode_s"):
            for n, opts in zip(names, options):
                self.codec.reset_stream(positions(n))
                pending[n] = memory.encode(self.codec, n, grads[n], **opts)
        return pending


__all__ = ["AllgatherPattern"]
