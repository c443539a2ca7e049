"""The center variable of the asynchronous schemes, sharded over the ranks.

Rank r owns the slice ``[bounds[r], bounds[r+1])`` of the flat parameter vector (about 1/K
of it), so no rank carries the whole model's traffic. A service thread per rank answers,
on its own duplicated communicator, two requests for its shard:

- PULL: reply with the shard's version and values;
- PUSH: receive an encoded update, decode it, add it to the shard, bump the version and
  reply with the version the shard had before the update.

Workers (the main threads) pull the whole center by asking every owner at once, and push
by sending each owner its part. The version counts updates applied to a shard, so the
staleness of a push (center updates between a worker's pull and its push) is the owner's
version before the push minus the version the worker pulled.

Why a service thread and not MPI one-sided windows: measured with Open MPI 4.1.4 over TCP
(see docs/results/schemes.md), a passive-target ``Lock``/``Get`` on a rank that is busy
computing (not calling MPI) waits until that rank enters MPI again, i.e. it makes no
asynchronous progress; a service thread answers while its rank computes. It needs
``MPI_THREAD_MULTIPLE``, which is checked.
"""
from __future__ import annotations

import atexit
import threading
import weakref
from typing import List, Optional, Tuple

import numpy as np
import torch

from .base import Scheme, mpi_type
from .backoff_waits import barrier, wait_all, wait_one

OP_PULL, OP_PUSH, OP_STOP = 1, 2, 3
TAG_REQ, TAG_DATA, TAG_META, TAG_VALUES = 301, 302, 303, 304
FAILED = -1

_LIVE: "weakref.WeakSet[ShardedCenter]" = weakref.WeakSet()


def shard_bounds(numel: int, size: int) -> List[int]:
    """``size + 1`` offsets splitting ``numel`` elements into near-equal contiguous shards."""
    base, extra = divmod(numel, size)
    bounds = [0]
    for r in range(size):
        bounds.append(bounds[-1] + base + (1 if r < extra else 0))
    return bounds


def require_thread_multiple() -> None:
    """Raise unless MPI was initialized with MPI_THREAD_MULTIPLE."""
    from mpi4py import MPI
    level = MPI.Query_thread()
    if level != MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED", MPI.THREAD_SERIALIZED: "SERIALIZED"}
        raise RuntimeError(
            f"asynchronous schemes need MPI_THREAD_MULTIPLE (a service thread per rank answers pulls and "
            f"pushes), but MPI was initialized with MPI_THREAD_{names.get(level, level)}; initialize MPI through "
            f"mpi4py (its default is THREAD_MULTIPLE) or hvd.init(), not with a lower thread level")


class CenterError(RuntimeError):
    """A shard owner could not apply a request (its service thread reported a failure)."""


class ShardedCenter:
    """Collective constructor: every rank passes the same ``initial`` flat vector.

    ``pull(out)`` fills ``out`` with the whole center and returns the versions pulled;
    ``push(delta, pulled_versions)`` adds ``delta`` (encoded through the scheme's codec) to
    the center and returns (what the center received, staleness). ``close()`` is collective.
    """

    def __init__(self, scheme: Scheme, initial: torch.Tensor):
        require_thread_multiple()
        self.scheme = scheme
        self.comm = scheme.comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.bounds = shard_bounds(scheme.numel, self.size)
        lo, hi = self.bounds[self.rank], self.bounds[self.rank + 1]
        self.shard = initial[lo:hi].to(scheme.dtype).clone()
        self.version = 0
        self.served = {"center_updates": 0, "pulls_served": 0, "bytes_served_in": 0, "bytes_served_out": 0}
        self._lock = threading.Lock()
        self._coders = [scheme.range_coder(self.bounds[r], self.bounds[r + 1]) for r in range(self.size)]
        self._own = scheme.range_coder(lo, hi)  # decodes pushes (stateless decode)
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._serve, name=f"hgc-center-{self.rank}", daemon=True)
        self._thread.start()
        self.closed = False
        _LIVE.add(self)
        barrier(self.comm)  # every service thread is up before any request

    # -- worker side --------------------------------------------------------------------
    def pull(self, out: torch.Tensor) -> np.ndarray:
        """Fill the flat CPU tensor ``out`` with the center; return each shard's version."""
        from mpi4py import MPI
        self._check_open()
        versions = np.zeros(self.size, dtype=np.int64)
        header = np.asarray([OP_PULL, 0, 0], dtype=np.int64)
        dt = mpi_type(self.scheme.dtype)
        reqs = []
        for r in range(self.size):
            lo, hi = self.bounds[r], self.bounds[r + 1]
            reqs.append(self.comm.Irecv([versions[r:r + 1], MPI.INT64_T], source=r, tag=TAG_META))
            reqs.append(self.comm.Irecv([out[lo:hi].numpy(), dt], source=r, tag=TAG_VALUES))
        reqs += [self.comm.Isend([header, MPI.INT64_T], dest=r, tag=TAG_REQ) for r in range(self.size)]
        wait_all(reqs)
        self._raise_failed(versions, "pull")
        nbytes = out.numel() * out.element_size()
        self.scheme.count("pulls")
        self.scheme.count("bytes_sent", header.nbytes * self.size)
        self.scheme.count("bytes_received", nbytes + versions.nbytes)
        return versions

    def push(self, delta: torch.Tensor, pulled: np.ndarray) -> Tuple[torch.Tensor, int]:
        """Add ``delta`` (flat, CPU) to the center, each owner its part, encoded through the
        scheme's codec. Returns (the values the center added, the push's staleness: the
        largest number of updates a shard received between ``pulled`` and this push)."""
        from mpi4py import MPI
        self._check_open()
        before = np.zeros(self.size, dtype=np.int64)
        sent = torch.empty_like(delta)
        reqs, keep = [], []
        for r in range(self.size):
            lo, hi = self.bounds[r], self.bounds[r + 1]
            message, decoded = self._coders[r].encode(delta[lo:hi])
            sent[lo:hi] = decoded
            header = np.asarray([OP_PUSH, message.size, 0], dtype=np.int64)
            keep += [message, header]
            reqs.append(self.comm.Irecv([before[r:r + 1], MPI.INT64_T], source=r, tag=TAG_META))
            reqs.append(self.comm.Isend([header, MPI.INT64_T], dest=r, tag=TAG_REQ))
            reqs.append(self.comm.Isend([message, MPI.BYTE], dest=r, tag=TAG_DATA))
            self.scheme.count("bytes_sent", message.size + header.nbytes)
        wait_all(reqs)
        self._raise_failed(before, "push")
        self.scheme.count("pushes")
        self.scheme.count("bytes_received", before.nbytes)
        staleness = int((before - pulled).max())
        return sent, staleness

    def close(self) -> None:
        """Collective: wait until every rank is done with the center, then stop the service."""
        if self.closed:
            return
        barrier(self.comm)
        self._stop_service()
        self.closed = True

    # -- owner side ---------------------------------------------------------------------
    def shard_state(self) -> Tuple[torch.Tensor, int]:
        with self._lock:
            return self.shard.clone(), self.version

    def load_shard(self, shard: torch.Tensor, version: int) -> None:
        with self._lock:
            if shard.shape != self.shard.shape:
                raise ValueError(f"center shard of rank {self.rank} has {self.shard.numel()} elements, "
                                 f"the checkpoint {shard.numel()}")
            self.shard.copy_(shard)
            self.version = int(version)

    def _serve(self) -> None:
        from mpi4py import MPI
        header = np.zeros(3, dtype=np.int64)
        status = MPI.Status()
        dt = mpi_type(self.scheme.dtype)
        while True:
            req = self.comm.Irecv([header, MPI.INT64_T], source=MPI.ANY_SOURCE, tag=TAG_REQ)
            if not wait_one(req, status, stop=self._stop):
                req.Cancel()
                req.Wait()
                return
            src, op = status.Get_source(), int(header[0])
            if op == OP_STOP:
                return
            try:
                if op == OP_PULL:
                    with self._lock:
                        values, version = self.shard.clone(), self.version
                    wait_all([self.comm.Isend([np.asarray([version], dtype=np.int64), MPI.INT64_T], dest=src,
                                              tag=TAG_META),
                              self.comm.Isend([values.numpy(), dt], dest=src, tag=TAG_VALUES)])
                    self.served["pulls_served"] += 1
                    self.served["bytes_served_out"] += values.numel() * values.element_size() + 8
                elif op == OP_PUSH:
                    message = np.empty(int(header[1]), dtype=np.uint8)
                    wait_one(self.comm.Irecv([message, MPI.BYTE], source=src, tag=TAG_DATA))
                    reply = FAILED
                    try:
                        delta = self._own.decode(message)
                        with self._lock:
                            reply = self.version
                            self.shard.add_(delta)
                            self.version += 1
                    except Exception as exc:  # reported to the pushing worker, which raises
                        self._error = exc
                    wait_one(self.comm.Isend([np.asarray([reply], dtype=np.int64), MPI.INT64_T], dest=src,
                                             tag=TAG_META))
                    self.served["center_updates"] += int(reply != FAILED)
                    self.served["bytes_served_in"] += message.size + header.nbytes
                    self.served["bytes_served_out"] += 8
                else:
                    raise CenterError(f"unknown request {op} from rank {src}")
            except Exception as exc:  # keep serving; the error is raised on this rank's next call
                self._error = exc

    def _stop_service(self) -> None:
        from mpi4py import MPI
        if self._thread.is_alive():
            stop = np.asarray([OP_STOP, 0, 0], dtype=np.int64)
            wait_one(self.comm.Isend([stop, MPI.INT64_T], dest=self.rank, tag=TAG_REQ))
            self._thread.join()
        _LIVE.discard(self)

    def stop_local(self, timeout: float) -> None:
        """Stop this rank's service thread without talking to its peers (at the interpreter's exit)."""
        self._stop.set()
        self._thread.join(timeout=timeout)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the center is closed (finish() was called)")
        if self._error is not None:
            raise CenterError(f"rank {self.rank}'s center service failed: {self._error!r}") from self._error

    def _raise_failed(self, versions: np.ndarray, what: str) -> None:
        bad = [r for r in range(self.size) if versions[r] == FAILED]
        if bad:
            raise CenterError(f"{what}: the owners of shards {bad} could not apply it (their rank raises the cause)")


@atexit.register
def _stop_services_at_exit() -> None:
    """A scheme left unfinished must not keep its service thread inside MPI while the
    interpreter finalizes MPI: stop the local threads (without talking to peers)."""
    for center in list(_LIVE):
        center.stop_local(timeout=5)
