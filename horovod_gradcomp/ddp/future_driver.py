"""The DDP hook's driver of request sequences (:mod:`horovod_gradcomp.exchange.requests`).

Each request of a bucket's sequence (:meth:`StepEngine.bucket_steps
<horovod_gradcomp.exchange.engine.StepEngine.bucket_steps>`, or the sparse job of
:mod:`.sparse_exchange`) is issued on the communicator's asynchronous twin (``comm.<op>_async``,
a :class:`~horovod_gradcomp.transports.torch_dist.Pending`). :func:`advance` runs a sequence until
it must wait for a collective; the hook (:mod:`.hook`) waits on a waiter thread and calls it
again with the result, in turn with the other buckets, the next of which may start issuing once
:attr:`Waiting.last_out`. The handle of an :class:`~horovod_gradcomp.exchange.requests.Issue`
never says ``done()`` (the hook does not poll). torch.distributed has no allgather of unknown
sizes: :func:`with_known_sizes` turns each ``allgatherv`` into ``sizes`` then
``allgatherv_known``. A failed sequence leaves what it issued to the backend (the step fails as a
whole, :meth:`StepEngine.fail_step <horovod_gradcomp.exchange.engine.StepEngine.fail_step>`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..exchange.requests import Collective, Issue, Steps, Wait


@dataclass
class Handle:
    """An issued collective: its ``pending`` result, its ``kind`` and when it was issued."""
    pending: Any
    kind: str
    issued_at: float

    @staticmethod
    def done() -> bool:
        return False


@dataclass
class Waiting(Handle):
    """Where a sequence stopped: the collective it waits for, and ``last_out``: its ``last``
    request was issued on the way."""
    last_out: bool = False


def advance(steps: Steps, answer: Any) -> Waiting:
    """Resume ``steps`` with ``answer`` and issue what it asks until it waits for a collective.
    Raises StopIteration (with the sequence's value) when it ends, and what it raises."""
    last_out = False
    while True:
        request = steps.send(answer)
        if isinstance(request, Wait):
            handle = request.handle
            return Waiting(handle.pending, handle.kind, handle.issued_at, last_out)
        call = request.collective if isinstance(request, Issue) else request
        if not isinstance(call, Collective):
            raise TypeError(f"hgc.ddp: a bucket's sequence yielded {request!r}, not a Collective, Issue or Wait")
        issued_at = time.perf_counter()
        pending = getattr(call.comm, call.op + "_async")(*call.args)   # its asynchronous twin
        last_out = last_out or call.last
        if not isinstance(request, Issue):
            return Waiting(pending, call.kind, issued_at, last_out)
        answer = Handle(pending, call.kind, issued_at)


def with_known_sizes(steps: Steps) -> Steps:
    """``steps`` with each ``allgatherv`` request done as ``sizes`` (one allgather of every rank's
    byte count) and then ``allgatherv_known`` of the same bytes (its ``last`` flag kept)."""
    answer = None
    try:
        while True:
            request = steps.send(answer)
            if isinstance(request, Collective) and request.op == "allgatherv":
                (send,) = request.args
                sizes = yield Collective("sizes", (send.numel(),), request.comm, "sizes", request.phase)
                answer = yield Collective("allgatherv_known", (send, sizes), request.comm, request.kind,
                                          request.phase, request.last)
            elif isinstance(request, Issue) and request.collective.op == "allgatherv":
                raise TypeError("hgc.ddp: an allgatherv of unknown sizes cannot be issued ahead on torch.distributed")
            else:
                answer = yield request
    except StopIteration as stop:
        return stop.value


__all__ = ["Handle", "Waiting", "advance", "with_known_sizes"]
