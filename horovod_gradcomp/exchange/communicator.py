"""The communicator seam: packed byte buffers between ranks through mpi4py.

It works on its own duplicate of ``MPI.COMM_WORLD``, never on the communicator Horovod
uses, so its collectives cannot pair with Horovod's. Building one performs no MPI call: rank
and size are local calls, and the duplicate is made by the first collective (inside the first
exchange, under the stall watchdog). Outside an MPI launcher mpi4py is imported on first use;
under one, importing horovod_gradcomp initializes MPI (:mod:`~horovod_gradcomp.exchange.mpi_lifetime`).

Buffers are flat uint8 tensors in host memory, or on a CUDA device when the MPI library is
CUDA-aware (:meth:`MPICommunicator.takes_device_buffers`; the direct path of
:mod:`~horovod_gradcomp.exchange.staging`): mpi4py then takes the tensors themselves (their
``__cuda_array_interface__``), and every receive buffer is allocated on the send buffer's device.
The device case has not run yet (no GPU here; ``ci/gpu_exchange_check.py`` runs it).
"""
from __future__ import annotations

import atexit
import threading
from typing import Optional, Sequence

import numpy as np
import torch

from . import staging
from .polling_comm import PollingComm


class ExchangeMismatchError(RuntimeError):
    """Ranks disagree on what is exchanged (different parameter sets, shapes or codecs)."""


class MPICommunicator:
    """Collectives on uint8 tensors over a duplicate of ``base`` (default ``MPI.COMM_WORLD``):
    host tensors, or CUDA tensors with a CUDA-aware MPI (see the module doc).

    Nothing here performs a collective outside the collective methods: ``rank`` and ``size``
    are local calls on ``base``, and the duplicate is made by :meth:`connect`, which the
    first collective of this object calls. That first collective is the preamble of the
    first bucket, inside the stall watchdog's guard, so every rank duplicates at the same
    point of the same exchange, and a rank that never arrives ends in the watchdog's abort
    instead of a hang.

    ``comm``: an mpi4py communicator (or an object with its methods) to use as is, without
    duplicating anything.
    """

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
        """The mpi4py communicator the collectives run on, duplicating ``base`` the first time.

        The duplicate is a collective over ``base``: call it only where every rank calls it
        at the same point, under the stall watchdog (the collective methods below do)."""
        if self._comm is None:
            with self._lock:
                if self._comm is None:
                    self._comm = self._duplicate(self._world())
                    _register_exit_check()
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
        (:mod:`horovod_gradcomp.exchange.polling_comm`); ``self`` when it already polls."""
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        inner = self.connect()  # inside an exchange: the duplicate exists already (the preamble made it)
        if isinstance(inner, PollingComm):
            return self
        return MPICommunicator(PollingComm(inner, float(interval_s)))

    def takes_device_buffers(self, device) -> bool:
        """True when the collectives take uint8 buffers on ``device`` (received bytes then land
        on ``device`` too): host memory always; a CUDA device when the MPI library is CUDA-aware
        (:func:`~horovod_gradcomp.exchange.staging.cuda_aware_mpi`)."""
        device = torch.device(device)
        return device.type == "cpu" or (device.type == "cuda" and staging.cuda_aware_mpi())

    def _checked(self, send: torch.Tensor, what: str) -> torch.device:
        """The device of ``send`` (where the receive buffer goes) after checking that it is a flat
        uint8 tensor these collectives take (TypeError otherwise)."""
        if not isinstance(send, torch.Tensor) or send.dtype != torch.uint8 or send.dim() != 1:
            raise TypeError(f"{what} expects a flat uint8 tensor, got {getattr(send, 'dtype', type(send).__name__)} "
                            f"{tuple(getattr(send, 'shape', ()))}")
        if not self.takes_device_buffers(send.device):
            raise TypeError(f"{what}: this MPI does not take buffers on {send.device} (host memory always; CUDA "
                            "memory only with a CUDA-aware MPI, and cuda_aware_mpi() is False here): stage the bytes "
                            "through host memory (horovod_gradcomp.exchange.staging)")
        return send.device

    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        """uint8[n] on every rank (same n everywhere) -> uint8[K, n], row k from rank k, on
        ``send``'s device."""
        device = self._checked(send, "allgather")
        recv = torch.empty((self.size, send.numel()), dtype=torch.uint8, device=device)
        from mpi4py import MPI
        staging.ready_for_mpi(device)
        self.connect().Allgather([_mpi_buffer(send), MPI.BYTE], [_mpi_buffer(recv), MPI.BYTE])
        return recv

    def allgatherv(self, send: torch.Tensor) -> list:
        """uint8[n_k] on rank k (sizes may differ) -> [uint8[n_0], ..., uint8[n_{K-1}]] (views of
        one receive buffer on ``send``'s device). One allgather of the sizes, then one
        allgatherv of the data."""
        device = self._checked(send, "allgatherv")
        from mpi4py import MPI
        sizes = np.empty(self.size, dtype=np.int64)
        self.connect().Allgather([np.array([send.numel()], dtype=np.int64), MPI.INT64_T], [sizes, MPI.INT64_T])
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        recv = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=device)
        staging.ready_for_mpi(device)
        self.connect().Allgatherv([_mpi_buffer(send), MPI.BYTE], [_mpi_buffer(recv), (sizes, offsets), MPI.BYTE])
        return [recv[int(o):int(o) + int(n)] for o, n in zip(offsets, sizes)]

    def alltoallv(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        """Personalized exchange with sizes known on both sides (no size exchange).

        ``send`` (flat uint8 CPU) holds this rank's segments back to back, in rank order:
        ``send_counts[j]`` bytes for rank j. Returns flat uint8 of ``sum(recv_counts)`` bytes:
        rank j's segment for this rank (``recv_counts[j]`` bytes) at offset
        ``sum(recv_counts[:j])``. ``send_counts[j]`` on rank r must equal ``recv_counts[r]``
        on rank j (not checked: MPI fails or truncates otherwise). One collective. The result is
        on ``send``'s device."""
        device = self._checked(send, "alltoallv")
        sc, rc, recv = alltoallv_buffers(send, send_counts, recv_counts, self.size, check=lambda t, what: None)
        from mpi4py import MPI
        staging.ready_for_mpi(device)
        self.connect().Alltoallv([_mpi_buffer(send), (sc, _displacements(sc)), MPI.BYTE],
                                 [_mpi_buffer(recv), (rc, _displacements(rc)), MPI.BYTE])
        return recv

    def allgatherv_known(self, send: torch.Tensor, counts: Sequence[int]) -> list:
        """Allgather of parts whose sizes every rank knows in advance: rank k passes its
        ``counts[k]`` bytes (flat uint8) and the same ``counts``; returns
        ``[uint8[counts[0]], ..., uint8[counts[K-1]]]`` (views into one receive buffer on
        ``send``'s device, part k at offset ``sum(counts[:k])``). One collective, no size exchange."""
        device = self._checked(send, "allgatherv_known")
        c = _counts(counts, self.size, "counts")
        if send.numel() != int(c[self.rank]):
            raise ValueError(f"allgatherv_known: rank {self.rank} sends {send.numel()} bytes, counts say "
                             f"{int(c[self.rank])}")
        displs = _displacements(c)
        recv = torch.empty(int(c.sum()), dtype=torch.uint8, device=device)
        from mpi4py import MPI
        staging.ready_for_mpi(device)
        self.connect().Allgatherv([_mpi_buffer(send), MPI.BYTE], [_mpi_buffer(recv), (c, displs), MPI.BYTE])
        return [recv[int(o):int(o) + int(n)] for o, n in zip(displs, c)]

    def allreduce_max(self, values: np.ndarray) -> np.ndarray:
        """Elementwise maximum over ranks of a float64 vector (one collective)."""
        from mpi4py import MPI
        mine = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(mine)
        self.connect().Allreduce([mine, MPI.DOUBLE], [out, MPI.DOUBLE], op=MPI.MAX)
        return out


_exit_check_registered = False


def _register_exit_check() -> None:
    """Register :func:`_abort_if_exchanging` once, at the first duplicate: after ``hvd.init()``
    and after mpi4py's import, so that it runs before Horovod's shutdown and MPI's finalize."""
    global _exit_check_registered
    if not _exit_check_registered:
        _exit_check_registered = True
        atexit.register(_abort_if_exchanging)


def _abort_if_exchanging() -> None:
    """At exit: when another thread of this process is still inside an exchange (a rank failed
    mid-step while the communication thread waits in a collective), end the MPI job with
    ``MPI_Abort`` and a message, instead of letting MPI be finalized under that thread."""
    from .watchdog import default_watchdog, mpi_abort
    if default_watchdog().active():
        mpi_abort("horovod_gradcomp: this process exits while another of its threads is still inside an exchange "
                  "(a rank failed during a step); aborting the MPI job rather than finalizing MPI under it")


def _check_bytes(send: torch.Tensor, what: str) -> None:
    if send.dtype != torch.uint8 or send.dim() != 1 or send.device.type != "cpu":
        raise TypeError(f"{what} expects a flat uint8 CPU tensor")


def _mpi_buffer(t: torch.Tensor):
    """What mpi4py reads or writes for ``t``: a numpy view of host memory, the CUDA tensor itself
    (mpi4py takes its ``__cuda_array_interface__``; only a CUDA-aware MPI gets one)."""
    return t.numpy() if t.device.type == "cpu" else t


def alltoallv_buffers(send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], size: int,
                      check=None):
    """The checked ``(send_counts, recv_counts, receive buffer)`` of an alltoallv among ``size`` ranks
    (every transport's ``alltoallv`` starts with this). ``check(send, what)`` vets the send buffer
    (default: a flat uint8 CPU tensor); the receive buffer is on ``send``'s device."""
    (check or _check_bytes)(send, "alltoallv")
    sc, rc = _counts(send_counts, size, "send_counts"), _counts(recv_counts, size, "recv_counts")
    if int(sc.sum()) != send.numel():
        raise ValueError(f"alltoallv: send holds {send.numel()} bytes, send_counts sum to {int(sc.sum())}")
    return sc, rc, torch.empty(int(rc.sum()), dtype=torch.uint8, device=send.device)


def _counts(counts: Sequence[int], size: int, what: str) -> np.ndarray:
    """Byte counts as a non-negative int64 vector of one entry per rank."""
    c = np.asarray(list(counts), dtype=np.int64)
    if c.shape != (size,) or (c < 0).any():
        raise ValueError(f"{what}: expected {size} non-negative byte counts, got {list(counts)}")
    return c


def _displacements(counts: np.ndarray) -> np.ndarray:
    """Offsets of back-to-back parts of the given sizes."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


_DEFAULT: Optional[MPICommunicator] = None


def default_communicator() -> MPICommunicator:
    """The process-wide communicator (one duplicate of COMM_WORLD shared by all adapters)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MPICommunicator()
    return _DEFAULT
