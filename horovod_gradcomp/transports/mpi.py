"""The MPI transport: packed byte buffers between ranks through mpi4py.

It works on its own duplicate of ``MPI.COMM_WORLD``, never on the communicator Horovod
uses, so its collectives cannot pair with Horovod's. Building one performs no MPI call: rank
and size are local calls, and the duplicate is made by the first collective (inside the first
exchange, under the stall watchdog). Outside an MPI launcher mpi4py is imported on first use;
under one, importing horovod_gradcomp initializes MPI (:mod:`~horovod_gradcomp.transports.mpi_lifetime`).

Buffers are flat uint8 tensors in host memory, or on a CUDA device when the MPI library is
CUDA-aware (:func:`cuda_aware_mpi`; the direct path of :mod:`~horovod_gradcomp.exchange.staging`):
mpi4py then takes the tensors themselves (``__cuda_array_interface__``), and MPI touches device
memory only once the work queued on the current stream has completed (:func:`ready_for_mpi`).
"""
from __future__ import annotations

import threading
import time
from typing import Optional, Sequence

import numpy as np
import torch

from .checks import alltoallv_counts, check_bytes, displacements, group_of, known_counts, split_parts
from .interface import Communicator, DeviceBufferCommunicator, SplittableCommunicator
from .mpi_lifetime import register_exit_check


class MPICommunicator(Communicator, SplittableCommunicator, DeviceBufferCommunicator):
    """Collectives on uint8 tensors over a duplicate of ``base`` (default ``MPI.COMM_WORLD``),
    made by the first collective (:meth:`connect`; see the module doc for why), or over ``comm``
    (an mpi4py communicator, or an object with its methods) as is, without duplicating anything."""

    def __init__(self, comm=None, base=None):
        self._comm = comm
        self._base = base
        self._lock = threading.Lock()

    def _world(self):
        """The communicator rank and size are read from (local calls only)."""
        if self._comm is not None:
            return self._comm
        if self._base is not None:
            return self._base
        from mpi4py import MPI  # noqa: WPS433 - deliberate lazy import (initializes MPI)
        return MPI.COMM_WORLD

    @property
    def connected(self) -> bool:
        """True once the duplicate exists (after the first collective)."""
        return self._comm is not None

    def connect(self):
        """The mpi4py communicator the collectives run on, duplicating ``base`` the first time:
        a collective over ``base``, called by the first collective of this object, the preamble
        of the first bucket, under the stall watchdog, so every rank duplicates at the same point
        and a rank that never arrives ends in the watchdog's abort instead of a hang."""
        if self._comm is None:
            with self._lock:
                if self._comm is None:
                    self._comm = self._duplicate(self._world())
                    register_exit_check()
        return self._comm

    def _duplicate(self, base):
        return base.Dup()

    @property
    def comm(self):
        """The duplicate. Raises before the first collective: reading it never duplicates."""
        if self._comm is None:
            raise RuntimeError("MPICommunicator.comm: no duplicate yet; it is made by the first collective "
                               "(connect(), inside an exchange)")
        return self._comm

    @property
    def rank(self) -> int:
        return self._world().Get_rank()

    @property
    def thread_multiple(self) -> bool:
        """True when the MPI library granted MPI_THREAD_MULTIPLE (a communication thread is safe)."""
        from mpi4py import MPI
        return MPI.Query_thread() == MPI.THREAD_MULTIPLE

    @property
    def size(self) -> int:
        return self._world().Get_size()

    def polling(self, interval_s: float) -> "MPICommunicator":
        """This communicator (the same MPI communicator: collectives keep their order) with
        collectives that wait by ``Test`` + ``sleep(interval_s)`` instead of spinning, for a
        thread that waits while another thread of the rank computes
        (:class:`PollingComm`); ``self`` when it already polls."""
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        inner = self.connect()  # inside an exchange: the duplicate exists already (the preamble made it)
        if isinstance(inner, PollingComm):
            return self
        return MPICommunicator(PollingComm(inner, float(interval_s)))

    def split(self, groups: Sequence[Sequence[int]]) -> "MPICommunicator":
        """The communicator of the group holding this rank, ``groups`` partitioning this
        communicator's ranks (every rank passes the same lists; see
        :class:`~horovod_gradcomp.transports.interface.SplittableCommunicator`): one
        ``MPI_Comm_split`` with the group's index as colour and the rank's place in it as key.
        A polling communicator's groups poll too. Collective."""
        color, key = group_of(groups, self.rank, self.size)
        return MPICommunicator(comm=self.connect().Split(color, key))

    def node_identity(self) -> tuple:
        """(lowest rank of this rank's shared-memory node, local rank in it): one
        ``MPI_Comm_split_type(COMM_TYPE_SHARED)`` and a MIN-allreduce on it, freed after (see
        :class:`~horovod_gradcomp.transports.interface.NodeAwareCommunicator`). Collective."""
        from mpi4py import MPI
        comm = self.connect()
        shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        try:
            return shared.allreduce(comm.Get_rank(), op=MPI.MIN), shared.Get_rank()
        finally:
            shared.Free()

    def takes_device_buffers(self, device) -> bool:
        """True when the collectives take uint8 buffers on ``device`` (received bytes then land
        on ``device`` too): host memory always; a CUDA device when the MPI library is CUDA-aware
        (:func:`cuda_aware_mpi`)."""
        device = torch.device(device)
        return device.type == "cpu" or (device.type == "cuda" and cuda_aware_mpi())

    def _checked(self, send: torch.Tensor, what: str) -> torch.device:
        """The device of ``send`` (where the receive buffer goes) after checking that it is a flat
        uint8 tensor these collectives take (TypeError otherwise)."""
        check_bytes(send, what, host_only=False)
        if not self.takes_device_buffers(send.device):
            raise TypeError(f"{what}: this MPI does not take buffers on {send.device} (host memory always; CUDA "
                            "memory only with a CUDA-aware MPI, and cuda_aware_mpi() is False here): stage the bytes "
                            "through host memory (horovod_gradcomp.exchange.staging)")
        return send.device

    # The collectives of the Communicator interface (their contracts there); every result is on
    # ``send``'s device, parts of a list are views of one receive buffer.
    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        device = self._checked(send, "allgather")
        recv = torch.empty((self.size, send.numel()), dtype=torch.uint8, device=device)
        from mpi4py import MPI
        ready_for_mpi(device)
        self.connect().Allgather([_mpi_buffer(send), MPI.BYTE], [_mpi_buffer(recv), MPI.BYTE])
        return recv

    def allgatherv(self, send: torch.Tensor) -> list:
        """One allgather of the sizes, then one allgatherv of the data."""
        device = self._checked(send, "allgatherv")
        from mpi4py import MPI
        sizes = np.empty(self.size, dtype=np.int64)
        self.connect().Allgather([np.array([send.numel()], dtype=np.int64), MPI.INT64_T], [sizes, MPI.INT64_T])
        recv = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=device)
        ready_for_mpi(device)
        self.connect().Allgatherv([_mpi_buffer(send), MPI.BYTE],
                                  [_mpi_buffer(recv), (sizes, displacements(sizes)), MPI.BYTE])
        return split_parts(recv, sizes)

    def alltoallv(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        """One collective. ``send_counts[j]`` on rank r must equal ``recv_counts[r]`` on rank j
        (not checked: MPI fails or truncates otherwise)."""
        device = self._checked(send, "alltoallv")
        sc, rc = alltoallv_counts(send, send_counts, recv_counts, self.size)
        recv = torch.empty(int(rc.sum()), dtype=torch.uint8, device=device)
        from mpi4py import MPI
        ready_for_mpi(device)
        self.connect().Alltoallv([_mpi_buffer(send), (sc, displacements(sc)), MPI.BYTE],
                                 [_mpi_buffer(recv), (rc, displacements(rc)), MPI.BYTE])
        return recv

    def allgatherv_known(self, send: torch.Tensor, counts: Sequence[int]) -> list:
        device = self._checked(send, "allgatherv_known")
        c = known_counts(send, counts, self.rank, self.size)
        displs = displacements(c)
        recv = torch.empty(int(c.sum()), dtype=torch.uint8, device=device)
        from mpi4py import MPI
        ready_for_mpi(device)
        self.connect().Allgatherv([_mpi_buffer(send), MPI.BYTE], [_mpi_buffer(recv), (c, displs), MPI.BYTE])
        return split_parts(recv, c)

    def allreduce_max(self, values: np.ndarray) -> np.ndarray:
        from mpi4py import MPI
        mine = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(mine)
        self.connect().Allreduce([mine, MPI.DOUBLE], [out, MPI.DOUBLE], op=MPI.MAX)
        return out


class PollingComm:
    """The mpi4py calls :class:`MPICommunicator` makes, on ``comm``, done as nonblocking requests
    completed by ``Test`` every ``interval_s`` seconds (why: :mod:`.mpi_polling`); ``Split``
    returns communicators that wait the same way."""

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


def _mpi_buffer(t: torch.Tensor):
    """What mpi4py reads or writes for ``t``: a numpy view of host memory, the CUDA tensor itself
    (mpi4py takes its ``__cuda_array_interface__``; only a CUDA-aware MPI gets one)."""
    return t.numpy() if t.device.type == "cpu" else t


def ready_for_mpi(device) -> None:
    """Return once the work queued so far on ``device``'s current CUDA stream has completed (one
    event, waited on the host): MPI reads and writes device memory outside any stream. Nothing to
    wait for on the CPU. Runs only with a GPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    with torch.cuda.device(device):
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        done.synchronize()


def cuda_aware_mpi() -> bool:
    """True when the MPI library says it can read CUDA device memory (Open MPI's
    ``MPIX_Query_cuda_support`` through mpi4py); False when it cannot or cannot tell."""
    try:
        from mpi4py import MPI
    except ImportError:
        return False
    query = getattr(MPI, "Query_cuda_support", None)
    try:
        return bool(query()) if query is not None else False
    except Exception:  # noqa: BLE001 - an MPI without the extension: not CUDA-aware
        return False


_DEFAULT: Optional[MPICommunicator] = None


def default_communicator() -> MPICommunicator:
    """The process-wide communicator (one duplicate of COMM_WORLD shared by all adapters)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MPICommunicator()
    return _DEFAULT


__all__ = ["MPICommunicator", "PollingComm", "cuda_aware_mpi", "default_communicator", "ready_for_mpi"]
