"""The torch.distributed transport (for the DDP comm hook).

:class:`TorchDistributedCommunicator` is an
:class:`~horovod_gradcomp.transports.interface.AsyncCommunicator`: the blocking collectives of
:class:`~horovod_gradcomp.transports.interface.Communicator` plus an asynchronous twin of each
(``*_async``: issued with ``async_op=True``, returning a :class:`Pending` of what the blocking
one returns). The blocking ones are the asynchronous ones waited for: one code path.

Python's exit. A gloo worker thread that frees a work holding a tensor Python created takes the
GIL, and the process aborts if Python is shutting down by then (the cause, as measured:
:mod:`horovod_gradcomp.ddp.gloo_exit`). So no Python runs on the backend's threads: a
:class:`Pending` finishes its result (slicing, stacking, the copy to numpy) on the thread that
waits for it, never in a ``Future.then`` callback; and the communicator keeps a reference to
its most recent works (:data:`KEEP_WORKS`, at most :data:`KEEP_BYTES` of their tensors beyond
the last :data:`KEEP_WORKS_MIN`), so that the work is freed later, with the GIL, by the thread
that issues a newer collective or by Python's teardown, not by a worker thread.

Its group: the one given (``hgc.ddp.register`` passes DDP's own process group, or ``group=``),
else a new gloo group over all ranks. The backend decides where the bytes live:

* gloo: uint8 CPU tensors, as the codecs produce them;
* NCCL: the byte buffers are moved to this rank's current CUDA device (a no-op for buffers
  already there) and every result stays on that device; the codecs' decode reads them there.
  This path is written but has NOT been run yet (no GPU on the development machines).

Parts of different sizes: torch's allgather takes equal sizes on every rank, so parts are
padded to the largest; :attr:`padding_bytes` counts the bytes sent beyond the payloads.

Order: collectives pair across ranks by the order in which each rank issues them on the
group. A caller that issues from several threads must order them itself (the DDP hook's
sequencer does, :mod:`horovod_gradcomp.ddp.hook`).
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from .checks import alltoallv_counts, check_bytes, group_of, known_counts
from .interface import AsyncCommunicator, PendingCollective, SplittableCommunicator


#: How many of the most recent works a communicator keeps (see the module doc) ...
KEEP_WORKS = 32
#: ... as long as their tensors hold at most this many bytes beyond the last KEEP_WORKS_MIN.
KEEP_BYTES = 256 << 20
KEEP_WORKS_MIN = 8


class Pending(PendingCollective):
    """A collective in flight and how to finish its result.

    ``wait()`` waits for ``inner`` (a work's ``torch.futures.Future``, another Pending, or None),
    passes its value to ``finish`` on the calling thread, and returns what ``finish`` returns;
    it raises what either raised. Every later ``wait()``, from any thread, returns (or raises)
    the same without waiting again. ``then(fn)`` is a Pending of ``fn(value)``.
    """

    def __init__(self, inner: Optional[Any], finish: Callable[[Any], Any]):
        self._inner = inner
        self._finish = finish
        self._lock = threading.Lock()
        self._settled = False
        self._value: Any = None
        self._error: Optional[BaseException] = None

    def wait(self) -> Any:
        with self._lock:
            if not self._settled:
                try:
                    value = self._inner.wait() if self._inner is not None else None
                    self._value = self._finish(value)
                except BaseException as exc:  # noqa: BLE001 - every waiter gets it
                    self._error = exc
                self._settled = True
                self._inner = self._finish = None
        if self._error is not None:
            raise self._error
        return self._value

    def then(self, fn: Callable[[Any], Any]) -> "Pending":
        return Pending(self, fn)


def _done(value) -> Pending:
    return Pending(None, lambda _: value)


class TorchDistributedCommunicator(AsyncCommunicator, SplittableCommunicator):
    """Collectives on flat uint8 tensors over a ``torch.distributed`` process group.

    Args:
        group: the process group (None: a new gloo group over all ranks, created here, so every
            rank must construct this object at the same point).

    Fields:
        group, backend ("gloo", "nccl", ...), device (where the byte buffers travel from:
        the CPU, or the current CUDA device on NCCL), padding_bytes (bytes sent beyond the
        payloads, every rank's padding of its own parts times the K-1 receivers).
    """

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("TorchDistributedCommunicator: call torch.distributed.init_process_group first")
        self._dist = dist
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.backend = str(dist.get_backend(self.group)).lower()
        if self.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.padding_bytes = 0
        self._lock = threading.Lock()
        self._recent: "collections.deque" = collections.deque()   # (work, bytes), newest last
        self._recent_bytes = 0
        # one flat output of K*n bytes (torch 2.13 renamed all_gather_into_tensor to all_gather_single)
        self._gather_flat = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)

    @property
    def rank(self) -> int:
        return self._dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return self._dist.get_world_size(self.group)

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous() if t.device == self.device else t.to(self.device, non_blocking=False).contiguous()

    def _add_padding(self, nbytes: int) -> None:
        with self._lock:
            self.padding_bytes += nbytes

    def _pending(self, work, finish: Callable[[Any], Any], *tensors: torch.Tensor) -> Pending:
        """The :class:`Pending` of ``work`` (whose ``tensors`` it holds), ``work`` kept among the
        recent works (see the module doc); the oldest leave (and are freed here, on this thread)
        beyond the window."""
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        with self._lock:
            self._recent.append((work, nbytes))
            self._recent_bytes += nbytes
            leaving = []
            while len(self._recent) > KEEP_WORKS_MIN and (len(self._recent) > KEEP_WORKS
                                                          or self._recent_bytes > KEEP_BYTES):
                old, old_bytes = self._recent.popleft()
                self._recent_bytes -= old_bytes
                leaving.append(old)
        del leaving   # freed outside the lock
        return Pending(work.get_future(), finish)

    # -- asynchronous collectives: a Pending of what the blocking one of the interface returns --
    def allgather_async(self, send: torch.Tensor) -> Pending:
        check_bytes(send, "allgather", host_only=False)
        send = self._on_device(send)
        k = self.size
        if k == 1:
            return _done(send.reshape(1, -1).clone())
        if self._gather_flat is not None:
            out = torch.empty(k * send.numel(), dtype=torch.uint8, device=self.device)
            work = self._gather_flat(out, send, group=self.group, async_op=True)
            return self._pending(work, lambda _: out.view(k, -1), out, send)
        parts = [torch.empty_like(send) for _ in range(k)]
        work = self._dist.all_gather(parts, send, group=self.group, async_op=True)
        return self._pending(work, lambda _: torch.stack(parts), send, *parts)

    def allgatherv_known_async(self, send: torch.Tensor, counts: Sequence[int]) -> Pending:
        """One allgather padded to the largest part (padding counted)."""
        check_bytes(send, "allgatherv_known", host_only=False)
        c = known_counts(send, counts, self.rank, self.size)
        longest = int(c.max()) if c.size else 0
        padded = send
        if send.numel() < longest:
            padded = torch.zeros(longest, dtype=torch.uint8, device=send.device)
            padded[:send.numel()] = send
        self._add_padding((longest - send.numel()) * (self.size - 1))
        return self.allgather_async(padded).then(lambda rows: [row[:int(n)] for row, n in zip(rows, c)])

    def sizes_async(self, n: int) -> Pending:
        """Future of every rank's ``n`` (int64 numpy vector): one allgather of 8 bytes."""
        mine = torch.tensor([n], dtype=torch.int64).view(torch.uint8)
        return self.allgather_async(mine).then(
            lambda rows: rows.cpu().contiguous().view(torch.int64).reshape(-1).numpy())

    def alltoallv_async(self, send: torch.Tensor, send_counts: Sequence[int],
                        recv_counts: Sequence[int]) -> Pending:
        """One ``all_to_all_single`` with uneven splits."""
        check_bytes(send, "alltoallv", host_only=False)
        k = self.size
        sc, rc = alltoallv_counts(send, send_counts, recv_counts, k)
        send = self._on_device(send)
        if k == 1:
            return _done(send.clone())
        recv = torch.empty(int(rc.sum()), dtype=torch.uint8, device=self.device)
        work = self._dist.all_to_all_single(recv, send, output_split_sizes=rc.tolist(),
                                            input_split_sizes=sc.tolist(), group=self.group, async_op=True)
        return self._pending(work, lambda _: recv, recv, send)

    def allreduce_max_async(self, values: np.ndarray) -> Pending:
        shape = np.shape(values)
        t = torch.from_numpy(np.array(values, dtype=np.float64).reshape(-1)).to(self.device)
        if self.size == 1:
            return _done(t.cpu().numpy().reshape(shape))
        work = self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group, async_op=True)
        return self._pending(work, lambda _: t.cpu().numpy().reshape(shape), t)

    # -- the Communicator interface (blocking): the asynchronous twins waited for ---------------
    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        return self.allgather_async(send).wait()

    def allgatherv(self, send: torch.Tensor) -> list:
        """One allgather of the sizes, then one allgather padded to the largest size."""
        check_bytes(send, "allgatherv", host_only=False)
        return self.allgatherv_known_async(send, self.sizes_async(send.numel()).wait()).wait()

    def alltoallv(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        return self.alltoallv_async(send, send_counts, recv_counts).wait()

    def allgatherv_known(self, send: torch.Tensor, counts: Sequence[int]) -> list:
        return self.allgatherv_known_async(send, counts).wait()

    def allreduce_max(self, values: np.ndarray) -> np.ndarray:
        return self.allreduce_max_async(values).wait()

    def split(self, groups: Sequence[Sequence[int]]) -> "TorchDistributedCommunicator":
        """The communicator of the group holding this rank (``groups``: lists of this group's
        ranks partitioning them, the same on every rank; see
        :class:`~horovod_gradcomp.transports.interface.SplittableCommunicator`): every rank
        creates a ``new_group`` for every group, in the given order, on this group's backend."""
        index, _ = group_of(groups, self.rank, self.size)
        ranks = self._dist.get_process_group_ranks(self.group)   # group rank -> global rank
        backend = self._dist.get_backend(self.group)
        mine = None
        for i, members in enumerate(groups):
            created = self._dist.new_group(ranks=[ranks[r] for r in members], backend=backend)
            if i == index:
                mine = created
        return TorchDistributedCommunicator(mine)

    def __repr__(self) -> str:
        return f"TorchDistributedCommunicator(backend={self.backend!r}, size={self.size})"
