"""Hand-over of tensors between threads, ordered on their CUDA streams by events.

Work on a CUDA device is queued on a stream, and each thread has its own current stream. When
a tensor written by one thread's work is read by another thread (a gradient that backward wrote,
read by the exchange thread's encode; a result that the exchange thread decoded, read by the
optimizer), the reader must not queue its work before the writer's has been ordered ahead of
it. So every hand-over between threads goes through :class:`StreamHandoff`:

* the producer, on its own thread and after queuing the work that writes the tensors, calls
  :meth:`StreamHandoff.record`: one event on the current stream of each CUDA device involved,
  carried by the returned :class:`HandoffMark`;
* the consumer, on its own thread and before queuing work that reads them, calls
  :meth:`StreamHandoff.wait` (or :meth:`StreamHandoff.wait_all`): its current stream waits for
  those events (a wait queued on the stream: the host does not block, the device is not
  synchronized), and the CUDA tensors it takes over are marked in use on its stream
  (``record_stream``), so that the caching allocator does not hand their memory to the
  producer's stream while the consumer's stream may still read them.

Where the package hands over (each records and waits under the names below):

* ``grad``: a gradient submitted to the step engine (:meth:`StepEngine.submit`, or a DDP bucket
  handed to the hook), recorded on the submitting thread, waited by the thread that exchanges
  its bucket (the ``hgc-exchange`` worker, the flushing thread, the DDP sequencer ``hgc-ddp``);
* ``result``: a bucket's results, recorded by the thread that decoded them
  (:meth:`StepEngine.close_bucket`), waited by the thread that closes the step and hands the
  results on (:meth:`StepEngine.close_step`: the caller of ``finish()``/``exchange()``, or the
  DDP hook's thread that completes DDP's futures, which are CUDA-aware futures then);
* ``resume``: a DDP bucket job moving from the thread that issued a collective to the waiter
  thread that resumes it (:mod:`horovod_gradcomp.ddp.hook`);
* ``wire-send`` / ``wire-recv``: the pipelined chunks' collectives moving to the wire thread and
  their results back (:class:`~horovod_gradcomp.exchange.pipeline.WireThread`).

CPU tensors need no event (CPU work is done when the call that queued it returns): there a mark
carries no event and a wait does nothing, but both are counted (``records``, ``waits``, and the
recent ``log`` of ``(kind, what, thread name)``), so the CPU tests check that every hand-over
happens where it should, through the real engine, pipeline and DDP hook. Only the four
``torch.cuda`` calls at the bottom of this file (event record, stream wait, ``record_stream``)
have not run: there is no GPU on the development machines (``ci/gpu_exchange_check.py`` runs
them).
"""
from __future__ import annotations

import collections
import itertools
import threading
from typing import Dict, Iterable, NamedTuple, Optional, Sequence, Tuple

import torch

#: How many recent hand-overs :attr:`StreamHandoff.log` keeps.
LOG_LEN = 4096


class HandoffMark(NamedTuple):
    """What a producer recorded: ``what`` (the hand-over's name), ``events`` (one
    ``(device, stream id, event)`` per CUDA device; empty for CPU tensors), ``thread`` (the
    producer's name), ``seq`` (recording order within its :class:`StreamHandoff`)."""
    what: str
    events: Tuple[tuple, ...]
    thread: str
    seq: int


class StreamHandoff:
    """Records and waits of hand-overs between threads (see the module doc).

    Fields: ``records`` and ``waits`` (hand-over name -> count; a mark waited by
    :meth:`wait_all` counts once even when a later event on the same stream covers it),
    ``log`` (the last :data:`LOG_LEN` ``(kind, what, thread name)``, kind "record" or "wait")."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self.records: Dict[str, int] = collections.Counter()
        self.waits: Dict[str, int] = collections.Counter()
        self.log: "collections.deque" = collections.deque(maxlen=LOG_LEN)

    def record(self, what: str, tensors: Iterable[torch.Tensor] = (), devices: Iterable = ()) -> HandoffMark:
        """On the producer's thread, after it queued the work that writes ``tensors``: an event
        on its current stream of every CUDA device among ``tensors`` and ``devices``."""
        cuda = _cuda_devices(tensors, devices)
        events = tuple((d,) + _record_event(d) for d in sorted(cuda, key=str))
        name = threading.current_thread().name
        with self._lock:
            self.records[what] += 1
            self.log.append(("record", what, name))
            return HandoffMark(what, events, name, next(self._seq))

    def wait(self, mark: Optional[HandoffMark], tensors: Iterable[torch.Tensor] = ()) -> None:
        """On the consumer's thread, before it queues work that reads what ``mark`` covers: its
        current stream of each device waits for the mark's event; the CUDA ``tensors`` it takes
        over are marked in use on that stream. ``mark`` None: nothing to wait for."""
        self.wait_all([] if mark is None else [mark], tensors)

    def wait_all(self, marks: Sequence[Optional[HandoffMark]], tensors: Iterable[torch.Tensor] = ()) -> None:
        """:meth:`wait` for every distinct mark (None entries skipped); of several events on one
        producer stream only the last recorded is waited for (it completes after the others)."""
        marks = sorted({m.seq: m for m in marks if m is not None}.values(), key=lambda m: m.seq)
        last: Dict[tuple, tuple] = {}
        for m in marks:
            for device, stream, event in m.events:
                last[(device, stream)] = (device, event)
        for device, event in last.values():
            _wait_event(device, event)
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                _keep_for_stream(t)
        name = threading.current_thread().name
        with self._lock:
            for m in marks:
                self.waits[m.what] += 1
                self.log.append(("wait", m.what, name))

    def seen(self, kind: str, what: str) -> list:
        """The thread names of the logged ``kind`` ("record"/"wait") of ``what``, oldest first."""
        with self._lock:
            return [thread for k, w, thread in self.log if k == kind and w == what]


def tensors_in(value) -> list:
    """The tensors of ``value``: itself, or those of a list/tuple (nested), else none."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def _cuda_devices(tensors: Iterable[torch.Tensor], devices: Iterable) -> set:
    found = {torch.device(d) for d in devices if torch.device(d).type == "cuda"}
    found.update(t.device for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cuda")
    return found


# -- the CUDA calls (need a GPU: not executed on the development machines) ----------------------

def _record_event(device: torch.device) -> tuple:
    """``(stream id, event)``: an event recorded on ``device``'s current stream."""
    stream = torch.cuda.current_stream(device)
    event = torch.cuda.Event()
    event.record(stream)
    return stream.cuda_stream, event


def _wait_event(device: torch.device, event) -> None:
    """``device``'s current stream waits for ``event`` (queued on the stream; the host goes on)."""
    torch.cuda.current_stream(device).wait_event(event)


def _keep_for_stream(tensor: torch.Tensor) -> None:
    """``tensor``'s memory is not reused before the current stream's work queued so far is done."""
    tensor.record_stream(torch.cuda.current_stream(tensor.device))


__all__ = ["HandoffMark", "LOG_LEN", "StreamHandoff", "tensors_in"]
