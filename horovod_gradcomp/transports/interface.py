"""The transport interface: the collectives the exchange patterns request, and nothing else.

Every transport (listed in :mod:`horovod_gradcomp.transports`) implements :class:`Communicator`;
the patterns, the preamble and the scale agreement call only these members. A transport declares
conformance by naming the protocol as a base class and defines every member itself
(``tests/test_transports.py`` checks that no member is left to the protocol's stub).

Capabilities some transports add are their own protocols below (:class:`AsyncCommunicator`,
:class:`SplittableCommunicator`, ...), which the exchange tests with ``isinstance``.

Buffers are flat uint8 tensors; counts are one byte count per rank, in rank order. Every member
except ``rank`` and ``size`` is a collective: every rank of the communicator calls it, in the same
order as the others.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import torch


class Communicator(Protocol):
    """The blocking collectives on byte buffers every transport provides."""

    @property
    def rank(self) -> int:
        """This rank's index in the communicator (a local call)."""
        ...

    @property
    def size(self) -> int:
        """The number of ranks K (a local call)."""
        ...

    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        """uint8[n] on every rank (the same n everywhere) -> uint8[K, n], row k from rank k."""
        ...

    def allgatherv(self, send: torch.Tensor) -> list:
        """uint8[n_k] on rank k (sizes may differ) -> ``[uint8[n_0], ..., uint8[n_{K-1}]]``;
        the sizes are exchanged first."""
        ...

    def alltoallv(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        """Personalized exchange with sizes known on both sides: ``send`` holds ``send_counts[j]``
        bytes for rank j, back to back; returns ``sum(recv_counts)`` bytes, rank j's part for this
        rank at offset ``sum(recv_counts[:j])``."""
        ...

    def allgatherv_known(self, send: torch.Tensor, counts: Sequence[int]) -> list:
        """Allgather of parts whose sizes every rank knows: rank k sends ``counts[k]`` bytes;
        returns ``[uint8[counts[0]], ..., uint8[counts[K-1]]]`` without exchanging sizes."""
        ...

    def allreduce_max(self, values: np.ndarray) -> np.ndarray:
        """The elementwise maximum over ranks of a float64 vector."""
        ...


class PendingCollective(Protocol):
    """A collective in flight: ``wait()`` returns what the blocking collective returns."""

    def wait(self) -> Any:
        ...

    def then(self, fn) -> "PendingCollective":
        """A :class:`PendingCollective` of ``fn(value)``."""
        ...


class AsyncCommunicator(Communicator, Protocol):
    """A :class:`Communicator` that also issues each collective without waiting for it: the
    ``*_async`` twins return a :class:`PendingCollective` of the blocking collective's result."""

    def allgather_async(self, send: torch.Tensor) -> PendingCollective:
        ...

    def allgatherv_known_async(self, send: torch.Tensor, counts: Sequence[int]) -> PendingCollective:
        ...

    def alltoallv_async(self, send: torch.Tensor, send_counts: Sequence[int],
                        recv_counts: Sequence[int]) -> PendingCollective:
        ...

    def allreduce_max_async(self, values: np.ndarray) -> PendingCollective:
        ...

    def sizes_async(self, n: int) -> PendingCollective:
        """A :class:`PendingCollective` of every rank's ``n`` (an int64 vector of K entries)."""
        ...


@runtime_checkable
class SplittableCommunicator(Protocol):
    """A communicator that can be split into groups of its ranks."""

    def split(self, groups: Sequence[Sequence[int]]) -> Communicator:
        """The communicator of the group holding this rank. ``groups`` partitions this
        communicator's ranks (lists of ranks, each in the order of the new communicator's ranks);
        every rank passes the same lists, and the groups are created in that order. Collective."""
        ...


@runtime_checkable
class DeviceBufferCommunicator(Protocol):
    """A communicator that may take buffers in device memory (MPI with a CUDA-aware library);
    one without this member takes host buffers only."""

    def takes_device_buffers(self, device) -> bool:
        """True when the collectives take uint8 buffers on ``device`` (received bytes then land
        there too)."""
        ...


@runtime_checkable
class NodeAwareCommunicator(Protocol):
    """A communicator that can tell which ranks share this rank's node (MPI's shared-memory split);
    one without this member leaves node discovery to the launcher's environment or the host name."""

    def node_identity(self) -> tuple:
        """(node key, local rank): the key is the same on every rank of this rank's node and
        differs between nodes; the local rank numbers the node's ranks from 0. Collective."""
        ...


@runtime_checkable
class PollableCommunicator(Protocol):
    """A communicator with a polling view for a thread that waits while another computes (mpi4py);
    one without this member waits in its own way (Horovod's and torch.distributed's threads)."""

    def polling(self, interval_s: float) -> Communicator:
        """The same communicator (collectives keep their order) whose collectives wait by testing
        and sleeping ``interval_s`` seconds instead of spinning."""
        ...


@runtime_checkable
class ThreadLevelCommunicator(Protocol):
    """A communicator that says whether a second thread may call it (MPI's granted thread level);
    one without this member may be called from any thread."""

    @property
    def thread_multiple(self) -> bool:
        """True when a communication thread is safe (MPI granted MPI_THREAD_MULTIPLE)."""
        ...


#: The collectives of :class:`Communicator` (what a recording wrapper times).
COLLECTIVES = ("allgather", "allgatherv", "alltoallv", "allgatherv_known", "allreduce_max")

__all__ = ["AsyncCommunicator", "COLLECTIVES", "Communicator", "DeviceBufferCommunicator", "NodeAwareCommunicator",
           "PendingCollective", "PollableCommunicator", "SplittableCommunicator", "ThreadLevelCommunicator"]
