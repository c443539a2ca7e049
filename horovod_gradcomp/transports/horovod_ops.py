"""The Horovod transport: Horovod's own collectives (works on MPI and on Gloo).

:class:`HorovodCommunicator` implements :class:`~horovod_gradcomp.transports.interface.Communicator`
and moves the same uint8 buffers through ``hvd.allgather`` (uneven first dimensions),
``hvd.alltoall`` (with splits) and ``hvd.allreduce(op=hvd.Max)``, on the global process set
or on one ``process_set``. It is what ``horovodrun --gloo`` and Horovod elastic need (no MPI
there) and what confines an exchange to a process set.

Every collective carries an explicit name, ``hgc.<prefix>.<call number>.<what>``: Horovod
pairs operations across ranks by name, and its automatic names number every Horovod op of
the process, so an op issued by another thread (a barrier, the optimizer's placeholders,
an exchange thread) would shift them differently on each rank. By default the call numbers
belong to the process set (``ps<id>``), shared by every communicator of the process on that
set: as with the one MPI duplicate, the order in which compressions are built does not
matter, only the order of their collectives, which must be the same on every rank (the
preamble of each bucket finds a disagreement).

Rank and size are the process set's (``process_set.rank()``, ``process_set.size()``). On a
rank outside the set the object is inert, as Horovod's optimizer is there: it may be built
(every rank can build the same model and compression) but any collective raises.
"""
from __future__ import annotations

import itertools
import threading
from typing import Optional, Sequence

import numpy as np
import torch

from ..errors import ExchangeMismatchError
from .checks import alltoallv_counts, check_bytes, known_counts, split_parts
from .interface import Communicator


class HorovodCommunicator(Communicator):
    """Collectives on uint8 CPU tensors through ``horovod.torch`` (call ``hvd.init()`` first).
    It cannot be split into sub-communicators (Horovod's process sets are registered up front).

    Args:
        process_set: a ``hvd.ProcessSet`` (None: the global one). On ranks outside it the
            object is inert (``member`` False): its collectives raise.
        prefix: the name prefix of this object's collectives, with its own call numbers
            (default: the process set's shared numbering, ``ps<id>``); the same on every
            rank of the set.
    """

    _counters: dict = {}             # prefix -> shared call numbering of the default prefixes
    _counters_lock = threading.Lock()

    def __init__(self, process_set=None, prefix: Optional[str] = None):
        import horovod.torch as hvd
        if not hvd.is_initialized():
            raise RuntimeError("HorovodCommunicator: call hvd.init() first")
        self._hvd = hvd
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        if self.process_set.process_set_id is None:
            raise ValueError(f"HorovodCommunicator: {self.process_set} is not registered with Horovod "
                             "(pass it to hvd.init(process_sets=...) or hvd.add_process_set first)")
        self.member = self.process_set.ranks is None or hvd.rank() in self.process_set.ranks
        if prefix is None:
            self.prefix = f"ps{self.process_set.process_set_id}"
            with HorovodCommunicator._counters_lock:
                self._numbering = HorovodCommunicator._counters.setdefault(self.prefix, [itertools.count()])
        else:
            self.prefix, self._numbering = prefix, [itertools.count()]

    @property
    def rank(self) -> int:
        """This rank in the set (outside the set, where the object is inert: the global rank)."""
        return int(self.process_set.rank()) if self.member else int(self._hvd.rank())

    @property
    def size(self) -> int:
        return int(self.process_set.size())

    def restart(self) -> None:
        """Number the collectives from zero again (every rank of the set at once: after a
        Horovod elastic reset, when ranks may have issued different numbers of calls)."""
        with HorovodCommunicator._counters_lock:
            self._numbering[0] = itertools.count()

    def _name(self, what: str) -> str:
        if not self.member:
            raise ValueError(f"HorovodCommunicator: rank {self._hvd.rank()} is not in {self.process_set}: a "
                             "compression built with this process_set is inert on this rank (as Horovod's optimizer "
                             "is); it must not exchange here")
        with HorovodCommunicator._counters_lock:
            return f"hgc.{self.prefix}.{next(self._numbering[0])}.{what}"

    def _gather_rows(self, rows: torch.Tensor, name: str) -> torch.Tensor:
        """Horovod allgather along dim 0 (first dims may differ between ranks)."""
        return self._hvd.allgather(rows, name=name, process_set=self.process_set)

    # -- the Communicator interface (its contracts there) --------------------------------------
    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        check_bytes(send, "allgather")
        out = self._gather_rows(send.reshape(1, -1), self._name("allgather"))
        if out.shape != (self.size, send.numel()):
            raise ExchangeMismatchError(f"allgather: ranks sent different sizes (got {tuple(out.shape)} for "
                                        f"{self.size} ranks of {send.numel()} bytes)")
        return out

    def allgatherv(self, send: torch.Tensor) -> list:
        """One allgather of the sizes, then one allgather of the data."""
        check_bytes(send, "allgatherv")
        call = self._name("allgatherv")
        sizes = self._gather_rows(torch.tensor([send.numel()], dtype=torch.int64), call + ".sizes").numpy()
        return split_parts(self._gather_rows(send, call), sizes)

    def alltoallv(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        """One ``hvd.alltoall``; the received splits are checked against ``recv_counts``."""
        check_bytes(send, "alltoallv")
        sc, rc = alltoallv_counts(send, send_counts, recv_counts, self.size)
        out, received = self._hvd.alltoall(send, splits=torch.from_numpy(sc.astype(np.int32)),
                                           name=self._name("alltoallv"), process_set=self.process_set)
        if not np.array_equal(received.numpy().astype(np.int64), rc):
            raise ExchangeMismatchError(f"alltoallv: rank {self.rank} expected {rc.tolist()} bytes from the ranks, "
                                        f"received {received.tolist()}")
        return out

    def allgatherv_known(self, send: torch.Tensor, counts: Sequence[int]) -> list:
        """One allgather, no size exchange."""
        check_bytes(send, "allgatherv_known")
        c = known_counts(send, counts, self.rank, self.size)
        recv = self._gather_rows(send, self._name("allgatherv_known"))
        if recv.numel() != int(c.sum()):
            raise ExchangeMismatchError(f"allgatherv_known: received {recv.numel()} bytes, counts sum to {int(c.sum())}")
        return split_parts(recv, c)

    def allreduce_max(self, values: np.ndarray) -> np.ndarray:
        """One ``hvd.allreduce``, ``op=hvd.Max``."""
        mine = torch.from_numpy(np.array(values, dtype=np.float64).reshape(-1))
        out = self._hvd.allreduce(mine, op=self._hvd.Max, name=self._name("max"), process_set=self.process_set)
        return out.numpy().reshape(np.shape(values))

    def __repr__(self) -> str:
        return f"HorovodCommunicator(process_set={self.process_set}, prefix={self.prefix!r})"

