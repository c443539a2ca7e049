"""The blocking driver: a pattern's requests (:mod:`.requests`) done on the calling thread
(the engine's, for Horovod, MPI and any communicator whose collectives block); each wait is
timed as ``exchange_s`` under its phase (``wait`` for a :class:`~.requests.Wait`). An
:class:`~.requests.Issue` goes to the driver's one :class:`~horovod_gradcomp.exchange.pipeline.WireThread`
(shared by every pattern, the inner exchange of the hierarchical one too), on the communicator's
polling twin (:func:`~horovod_gradcomp.exchange.pipeline.wire_communicator`), when the
communicator may be called from a second thread (``threads_allowed``); otherwise it is done at once.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, Dict, List

from .pipeline import WireFuture, WireThread, timed_wire, wire_communicator
from .requests import Collective, Issue, Steps, Wait
from .stats import ExchangeStats


class BlockingDriver:
    """Runs request sequences to their end on the calling thread (see the module doc).

    Fields: stats (where the waits are timed); threads_allowed (``threads_allowed(comm)``: may
    ``comm`` be called from the wire thread); wire (the :class:`WireThread`, started by the
    first issued collective)."""

    def __init__(self, stats: ExchangeStats, threads_allowed: Callable[[object], bool] = lambda comm: True):
        self.stats = stats
        self.threads_allowed = threads_allowed
        self.wire = WireThread()

    def run(self, steps: Steps):
        """Answer every request of ``steps``; return its result. On an error, the collectives
        issued to the wire thread and not waited for are cancelled or waited out first."""
        outstanding: List[WireFuture] = []
        wires: Dict[int, object] = {}
        answer = None
        try:
            while True:
                try:
                    request = steps.send(answer)
                except StopIteration as stop:
                    return stop.value
                answer = self._answer(request, outstanding, wires)
        except BaseException:
            WireThread.cancel(outstanding)
            raise

    def _answer(self, request, outstanding: List[WireFuture], wires: Dict[int, object]):
        if isinstance(request, Wait):
            with self.stats.timed("exchange_s", phase="wait"):
                value = request.handle.result()
            if request.handle in outstanding:
                outstanding.remove(request.handle)
            return value
        call = request.collective if isinstance(request, Issue) else request
        if not isinstance(call, Collective):
            raise TypeError(f"blocking driver: a pattern yielded {request!r}, not a Collective, Issue or Wait")
        if call is request or not self.threads_allowed(call.comm):
            with self.stats.timed("exchange_s", phase=call.phase):
                value = getattr(call.comm, call.op)(*call.args)
            if call is request:
                return value
            done: Future = Future()   # the Issue's handle, already done
            done.set_result(value)
            return done
        wire = wires.get(id(call.comm))
        if wire is None:
            wire = wires[id(call.comm)] = wire_communicator(call.comm)
        handle = self.wire.submit(timed_wire, self.stats, getattr(wire, call.op), *call.args)
        outstanding.append(handle)
        return handle


__all__ = ["BlockingDriver"]
