"""The allgather pattern: every rank sends its whole payload to every other rank.

Per rank and exchange this sends (K-1) x S bytes for a payload of S bytes, so it stops
paying when K approaches twice the compression ratio (see :mod:`horovod_gradcomp.two_phase`
for the pattern whose traffic stays flat in K). Payloads are encoded before the call (in the
gradient hooks); this module fuses, exchanges and decodes the mean.
"""
from __future__ import annotations

import time
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch

from .codecs.base import Codec, Payload
from .comm import MPICommunicator
from .fusion import FusedLayout, pack_variable, unpack_variable
from .stats import allgather_wire_bytes


class AllgatherExchange:
    """Fixed-size payloads: one allgather of the fused buffer; variable-size payloads
    (``codec.variable_size``): an allgather of the sizes, then an allgatherv."""

    def __init__(self, codec: Codec):
        self.codec = codec
        self._layouts: Dict[tuple, FusedLayout] = {}

    def layout(self, names: Sequence[str], pending: Mapping[str, Payload]) -> FusedLayout:
        entries = tuple((n, tuple(pending[n].shape), pending[n].dtype) for n in names)
        layout = self._layouts.get(entries)
        if layout is None:
            if len(self._layouts) >= 64:  # buckets rarely change; do not grow without bound
                self._layouts.clear()
            layout = self._layouts[entries] = FusedLayout(self.codec, entries)
        return layout

    def exchange(self, comm: MPICommunicator, names: Sequence[str], pending: Mapping[str, Payload],
                 outs: Mapping[str, Optional[torch.Tensor]]) -> Tuple[Dict[str, torch.Tensor], dict]:
        """Exchange this rank's ``pending[name]`` payloads (same names and order on every rank)
        and return ``(results, info)``: ``results[name]`` is the mean over ranks of the decoded
        payloads (written into ``outs[name]`` when that is not None); ``info`` has ``k``,
        ``payload`` (bytes this rank contributed), ``sent`` (wire bytes: (K-1) x payload, plus
        8 for the size when variable), ``exchange_s`` and ``decode_s``."""
        t0 = time.perf_counter()
        results: Dict[str, torch.Tensor] = {}
        if getattr(self.codec, "variable_size", False):
            send = pack_variable(names, pending)
            parts = comm.allgatherv(send)
            k, payload, extra = len(parts), send.numel(), 8
            t1 = time.perf_counter()
            decoded = [unpack_variable(part, names, pending) for part in parts]
            for n in names:
                results[n] = self.codec.decode_many([d[n] for d in decoded], out=outs.get(n))
        else:
            layout = self.layout(names, pending)
            recv = comm.allgather(layout.pack(pending))
            k, payload, extra = recv.shape[0], layout.nbytes, 0
            t1 = time.perf_counter()
            devices = {n: pending[n].device for n in names}
            for name, stacked in layout.unpack(recv, devices):
                results[name] = self.codec.decode_mean(stacked, out=outs.get(name))
        t2 = time.perf_counter()
        return results, {"k": k, "payload": payload, "sent": allgather_wire_bytes(payload + extra, k),
                         "exchange_s": t1 - t0, "decode_s": t2 - t1}
