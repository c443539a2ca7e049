"""Traffic and time counters of one adapter on one rank.

Two views of traffic, both cumulative for this rank:

* payload bytes: what this rank encoded per exchange (its own contribution);
  ``bytes_payload_dense`` is the same tensors as fp32.
* wire bytes: what this rank transmits in a bandwidth-optimal implementation of the
  collective used: an allgather of S bytes sends (K-1)*S per rank, a ring allreduce of B
  bytes sends 2(K-1)/K*B. ``bytes_dense`` is the fp32 ring allreduce of the same tensors,
  what stock Horovod would have sent.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass


def allreduce_wire_bytes(nbytes: float, k: int) -> float:
    """Bytes one rank sends in a ring allreduce of ``nbytes`` among ``k`` ranks."""
    return 2.0 * (k - 1) / k * nbytes if k > 1 else 0.0


def allgather_wire_bytes(nbytes: float, k: int) -> float:
    """Bytes one rank sends in an allgather of ``nbytes`` per rank among ``k`` ranks."""
    return float((k - 1) * nbytes)


@dataclass
class ExchangeStats:
    steps: int = 0                     # exchanges completed
    tensors: int = 0                   # tensors exchanged, summed over steps
    bytes_payload: int = 0
    bytes_payload_dense: int = 0
    bytes_sent: float = 0.0
    bytes_dense: float = 0.0
    encode_s: float = 0.0              # time in encode (and error feedback)
    exchange_s: float = 0.0            # time in collectives, packing included
    decode_s: float = 0.0              # time decoding / averaging
    nonfinite_steps: int = 0           # steps skipped because some rank had a NaN or Inf gradient
    #: Of ``bytes_sent``: what the hierarchical pattern's dense steps sent inside the node ...
    bytes_sent_intra_node: float = 0.0
    #: ... and everything else (between nodes: the codec's payloads, shared scales, preambles;
    #: on a flat pattern all of ``bytes_sent``, as if every peer were on another node).
    bytes_sent_inter_node: float = 0.0
    #: An optional :class:`~horovod_gradcomp.exchange.timeline.Timeline` that also gets every
    #: timed block as an interval (None: off). A class attribute, not a counter: not in as_dict().
    timeline = None

    @contextmanager
    def timed(self, field: str, phase: str = ""):
        """Add the seconds spent in the ``with`` block to ``field`` (``encode_s``, ``exchange_s``
        or ``decode_s``): the one timer of the exchange. With a timeline attached, the block is
        also recorded as an interval named ``phase`` (default: ``field`` without ``_s``)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            setattr(self, field, getattr(self, field) + t1 - t0)
            if self.timeline is not None:
                self.timeline.add(phase or field[:-2], t0, t1)

    def record_step(self, totals: "StepTotals") -> None:
        """Close a step whose buckets added up to ``totals``."""
        self.steps += 1
        self.bytes_sent_intra_node += totals.intra
        self.bytes_sent_inter_node += totals.sent - totals.intra
        self.tensors += totals.tensors
        self.bytes_payload += totals.payload
        self.bytes_payload_dense += 4 * totals.numel
        self.bytes_sent += totals.sent
        self.bytes_dense += allreduce_wire_bytes(4 * totals.numel, totals.k)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["payload_ratio"] = self.bytes_payload_dense / self.bytes_payload if self.bytes_payload else None
        d["wire_ratio"] = self.bytes_dense / self.bytes_sent if self.bytes_sent else None
        d["bytes_sent_per_step"] = self.bytes_sent / self.steps if self.steps else 0.0
        d["bytes_dense_per_step"] = self.bytes_dense / self.steps if self.steps else 0.0
        return d


@dataclass
class StepTotals:
    """What one step's buckets added up to (recorded once per step by :meth:`ExchangeStats.record_step`)."""
    tensors: int = 0
    payload: int = 0          # bytes this rank encoded
    numel: int = 0
    sent: float = 0.0         # wire bytes this rank sent (collectives of data, scales and checks)
    k: int = 1
    intra: float = 0.0        # of ``sent``: inside the node (the hierarchical pattern's dense steps)

    def add(self, *, tensors: int = 0, payload: int = 0, numel: int = 0, sent: float = 0.0,
            intra: float = 0.0) -> None:
        self.intra += intra
        self.tensors += tensors
        self.payload += payload
        self.numel += numel
        self.sent += sent
