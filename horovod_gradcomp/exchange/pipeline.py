"""Pipelined exchange of one bucket: encode, wire and decode of consecutive chunks overlap.

Without it a bucket is encoded whole, then sent whole, then decoded whole: on a slow link the
CPU waits for the wire and the wire waits for the CPU, and the step costs encode + wire +
decode. Cut into chunks of about ``chunk_bytes`` of payload, chunk i+1 is encoded while chunk i
is on the wire, and chunk i-1 decoded meanwhile: the step tends to max(encode + decode, wire)
plus one chunk's encode and decode.

Only one thread, :class:`WireThread`'s, calls the communicator while a pipelined bucket is in
flight, and it runs the collectives in the order they were submitted, an order that depends on
the bucket's names alone: every rank issues the same collectives in the same order, whatever
its timing. Decoding is on the calling thread, in whatever order the chunks arrive (decoding
is local).

Streams: a call's tensors go to the wire thread, and its result comes back, through a
:class:`~horovod_gradcomp.exchange.stream_handoff.StreamHandoff` (``wire-send``, ``wire-recv``).
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ..codecs.base import Codec
from ..transports.interface import PollableCommunicator
from .bucket import BoundedCache
from .env import seconds_from_env
from .stream_handoff import HandoffMark, StreamHandoff, tensors_in

#: Default payload bytes per chunk (the factories' ``pipeline_bytes``): measured on ResNet-50's
#: shapes (docs/results/README.md, "Pipelined exchange").
DEFAULT_CHUNK_BYTES = 1 << 19
#: How the wire thread waits for an MPI collective by default: ``Test`` every this many seconds,
#: sleeping in between, so that it does not take the core from the thread that encodes the next
#: chunk (measured: docs/results/README.md, "Pipelined exchange"). The environment variable
#: ``HOROVOD_GRADCOMP_WIRE_POLL_S`` overrides it; 0 there means blocking (spinning) collectives.
WIRE_POLL_S = 5e-5
WIRE_POLL_ENV = "HOROVOD_GRADCOMP_WIRE_POLL_S"
#: At most this many chunks per bucket: larger payloads get larger chunks (every chunk costs
#: its collectives' latency and, on a shared core, the wire thread's polling).
MAX_CHUNKS = 8


def plan_chunks(codec: Codec, entries: Sequence[Tuple[str, torch.Size, torch.dtype]],
                chunk_bytes: int) -> List[List[Tuple[str, torch.Size, torch.dtype]]]:
    """``entries`` (name, shape, dtype in exchange order) cut into consecutive chunks of at least
    ``max(chunk_bytes, payload / MAX_CHUNKS)`` of payload each (whole tensors; the last chunk
    takes the remainder, and one of less than half that size joins the chunk before it).
    Depends on shapes only, so every rank gets the same chunks."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    sizes = [codec.payload_nbytes(shape, dtype) for _, shape, dtype in entries]
    chunk_bytes = max(chunk_bytes, -(-sum(sizes) // MAX_CHUNKS))
    chunks: List[list] = []
    current, size = [], 0
    for entry, nbytes in zip(entries, sizes):
        current.append(entry)
        size += nbytes
        if size >= chunk_bytes:
            chunks.append(current)
            current, size = [], 0
    if current:
        if chunks and size < chunk_bytes // 2:
            chunks[-1].extend(current)
        else:
            chunks.append(current)
    return chunks


class ChunkPlanner:
    """A pattern's chunk plans, cached by bucket (buckets rarely change).

    Fields: codec; chunk_bytes (payload bytes per chunk, None: no chunks)."""

    def __init__(self, codec: Codec, chunk_bytes: Optional[int]):
        self.codec, self.chunk_bytes = codec, chunk_bytes
        self._plans = BoundedCache(64)

    def chunks(self, entries: Sequence[Tuple[str, Sequence[int], torch.dtype]], k: int) -> Optional[List[list]]:
        """:func:`plan_chunks` of ``entries`` (name, shape, dtype), or None when the bucket goes
        whole: no ``chunk_bytes``, one rank, variable-size payloads, or a single chunk."""
        if not self.chunk_bytes or k <= 1 or self.codec.variable_size:
            return None
        key = tuple((n, tuple(s), dt) for n, s, dt in entries)
        chunks = self._plans.get_or_make(key, lambda: plan_chunks(self.codec, key, self.chunk_bytes))
        return chunks if len(chunks) > 1 else None


class WireThread:
    """One daemon thread running collectives one at a time, in submission order.

    :meth:`submit` returns a :class:`WireFuture` of the call's result (its exception re-raised
    by ``result()``). The thread starts on the first submit and lives as long as its owner (the
    engine's :class:`~horovod_gradcomp.exchange.blocking_driver.BlockingDriver`). ``handoff``: the stream hand-overs of its calls (see the module doc)."""

    def __init__(self, name: str = "hgc-wire"):
        self._name = name
        self._executor = None
        self._lock = threading.Lock()
        self.handoff = StreamHandoff()

    @property
    def started(self) -> bool:
        """True once a call has been submitted (the thread exists)."""
        return self._executor is not None

    def submit(self, fn: Callable, *args) -> "WireFuture":
        """Run ``fn(*args)`` on the wire thread after the calls submitted before; the tensors
        among ``args`` are handed over from this thread's streams to the wire thread's."""
        mark = self.handoff.record("wire-send", tensors_in(args))
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
            return WireFuture(self._executor.submit(_handed_call, self.handoff, mark, fn, args), self.handoff)

    @staticmethod
    def cancel(futures: Sequence[Future]) -> None:
        """Cancel the calls that have not started; wait for the one that has (a collective cannot
        be abandoned halfway: its peers may still be in it), ignoring its outcome."""
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                try:
                    f.exception()
                except BaseException:  # noqa: BLE001 - only waiting for it to end
                    pass


def _handed_call(handoff: StreamHandoff, mark: HandoffMark, fn: Callable, args: tuple):
    """On the wire thread: wait for the submitter's mark, call, record the result's mark."""
    handoff.wait(mark)
    value = fn(*args)
    return value, handoff.record("wire-recv", tensors_in(value))


class WireFuture:
    """A wire call's :class:`~concurrent.futures.Future` whose :meth:`result` also hands the
    result's tensors over to the streams of the thread that calls it."""

    def __init__(self, inner: Future, handoff: StreamHandoff):
        self._inner, self._handoff = inner, handoff

    def result(self, timeout: Optional[float] = None):
        value, mark = self._inner.result(timeout)
        self._handoff.wait(mark, tensors_in(value))
        return value

    def __getattr__(self, name):   # done, cancel, cancelled, exception: the inner future's
        return getattr(self._inner, name)


def wire_poll_s() -> float:
    """The wire thread's polling interval: ``HOROVOD_GRADCOMP_WIRE_POLL_S`` if set (seconds, >= 0;
    0: blocking collectives), else :data:`WIRE_POLL_S`."""
    value = seconds_from_env(WIRE_POLL_ENV, "blocking collectives")
    return WIRE_POLL_S if value is None else value


def wire_communicator(comm):
    """What the wire thread calls: ``comm.polling(interval)`` when the communicator can poll
    (mpi4py) and the interval (:func:`wire_poll_s`) is not 0; ``comm`` itself otherwise
    (Horovod's and torch.distributed's collectives wait in their own threads)."""
    interval = wire_poll_s()
    return comm.polling(interval) if isinstance(comm, PollableCommunicator) and interval > 0 else comm


def timed_wire(stats, collective, *args):
    """``collective(*args)`` on the wire thread, recorded as ``wire`` when a timeline is attached."""
    if stats.timeline is None:
        return collective(*args)
    with stats.timeline.span("wire"):
        return collective(*args)


__all__ = ["ChunkPlanner", "DEFAULT_CHUNK_BYTES", "MAX_CHUNKS", "WIRE_POLL_ENV", "WIRE_POLL_S", "WireFuture", "WireThread",
           "plan_chunks", "timed_wire", "wire_communicator", "wire_poll_s"]
