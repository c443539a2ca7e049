"""A communicator that waits without spinning, for exchanges that overlap compute on a busy core.

Open MPI progresses a blocking collective by polling its transports in a loop: the thread
that waits holds a core at 100% for the whole transfer. When the exchange runs in a
background thread of a rank that has one core (the double-buffered pipeline, 2 ranks on 2
cores), that loop takes the core from the forward/backward pass it is meant to overlap.

:class:`PollingCommunicator` is an :class:`~horovod_gradcomp.transports.mpi.MPICommunicator` whose
collectives are the nonblocking MPI ones (``Iallgather``, ``Iallgatherv``,
``Ialltoallv``, ``Iallreduce``), completed by calling ``Test`` every ``interval_s``
seconds and sleeping in between (the GIL and the core are free while it sleeps). What is
sent and received is exactly what the blocking collectives send; only the waiting
differs. The cost: up to ``interval_s`` of extra latency per collective, and progress
happens only at each ``Test`` (a transfer larger than the socket buffers needs several).
Pass it as ``communicator=`` to a codec's ``hgc.Compression`` factory.
"""
from __future__ import annotations

from .mpi import MPICommunicator, PollingComm

__all__ = ["PollingCommunicator"]


class PollingCommunicator(MPICommunicator):
    """:class:`MPICommunicator` on its own duplicate of COMM_WORLD (made by its first collective),
    waiting for each collective by ``Test`` + ``sleep(interval_s)`` instead of spinning."""

    def __init__(self, interval_s: float = 2e-4, base=None):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        super().__init__(base=base)
        self.interval_s = float(interval_s)

    def _duplicate(self, base):
        return PollingComm(super()._duplicate(base), self.interval_s)

    def __repr__(self) -> str:
        return f"PollingCommunicator(interval_s={self.interval_s})"
