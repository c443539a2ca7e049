"""The wait loop of :mod:`horovod_gradcomp.transports.mpi_polling`: an mpi4py communicator whose
blocking collectives are its nonblocking ones plus ``Test`` and ``sleep``.

Kept apart from :class:`~horovod_gradcomp.transports.mpi_polling.PollingCommunicator` so that
:meth:`MPICommunicator.polling <horovod_gradcomp.transports.mpi.MPICommunicator.polling>`
can wrap a communicator it already has without importing the subclass.
"""
from __future__ import annotations

import time

__all__ = ["PollingComm"]


class PollingComm:
    """The mpi4py calls :class:`~horovod_gradcomp.transports.mpi.MPICommunicator` makes, on
    ``comm``, done as nonblocking requests completed by ``Test`` every ``interval_s`` seconds;
    ``Split`` returns communicators that wait the same way."""

    def __init__(self, comm, interval_s: float):
        self._c = comm
        self._interval = interval_s

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self._c.Get_rank()

    def Get_size(self) -> int:  # noqa: N802
        return self._c.Get_size()

    def Split(self, color: int, key: int) -> "PollingComm":  # noqa: N802
        """``MPI_Comm_split`` of ``comm`` (a blocking collective: MPI has no nonblocking split),
        its result waiting by ``Test`` + ``sleep`` as this one does."""
        return PollingComm(self._c.Split(color, key), self._interval)

    def Split_type(self, split_type: int, key: int):  # noqa: N802
        """``MPI_Comm_split_type`` of ``comm``: a plain mpi4py communicator (what it is used for,
        finding the node, waits once; nothing to poll)."""
        return self._c.Split_type(split_type, key=key)

    def Allgather(self, send, recv) -> None:  # noqa: N802
        self._wait(self._c.Iallgather(send, recv))

    def Allgatherv(self, send, recv) -> None:  # noqa: N802
        self._wait(self._c.Iallgatherv(send, recv))

    def Alltoallv(self, send, recv) -> None:  # noqa: N802
        self._wait(self._c.Ialltoallv(send, recv))

    def Allreduce(self, send, recv, op=None) -> None:  # noqa: N802
        from mpi4py import MPI
        self._wait(self._c.Iallreduce(send, recv, op=MPI.SUM if op is None else op))

    def _wait(self, request) -> None:
        while not request.Test():
            time.sleep(self._interval)
