"""A whole job's compression state in one file.

``compression.state_dict()`` is one rank's state (residuals differ between ranks). These two
helpers save every rank's into one file written by rank 0, and give each rank its own part
back, through the compression's own communicator (the same one its exchange uses):

    hgc.save_job_state(compression, "ckpt/compression.pt")     # every rank calls it
    hgc.load_job_state(compression, "ckpt/compression.pt")     # every rank calls it

The file holds ``{"world_size": K, "ranks": [state of rank 0, ..., state of rank K-1]}``.
Loading into a job of another size raises ``ValueError`` naming both sizes on every rank.
Both run under the stall watchdog with the compression's timeout, like a step's exchange.

The file and the ranks' parts that travel between processes are data, not code: read only
with ``torch.load(..., weights_only=True)`` (:mod:`horovod_gradcomp.state.checkpoint_data`); a
file holding any other object is refused on every rank with a message saying so.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import torch

from ..state.checkpoint_data import UnsafeCheckpointError, from_bytes, load_data, to_bytes


@contextmanager
def _guarded(compression, what: str):
    """The block under the stall watchdog, with the compression's own timeout."""
    from ..exchange.watchdog import default_watchdog, resolve_timeout
    engine = getattr(compression, "engine", None)
    timeout = engine.timeout if engine is not None else resolve_timeout(getattr(compression, "timeout", None))
    with default_watchdog().guard(timeout, what):
        yield


def _run_guarded(body, name: str, compression, path: str) -> None:
    """``body(compression, comm, path)`` under the stall watchdog, reported as ``name``."""
    comm = compression.current_communicator()
    with _guarded(compression, f"{name}({path!r}) on rank {comm.rank}"):
        body(compression, comm, path)


def save_job_state(compression, path: str) -> None:
    """Gather every rank's ``compression.state_dict()`` and write them to ``path`` on rank 0.
    A collective: every rank calls it."""
    _run_guarded(_save, "save_job_state", compression, path)


def _save(compression, comm, path: str) -> None:
    mine = to_bytes(compression.state_dict())
    parts = comm.allgatherv(mine) if comm.size > 1 else [mine]
    if comm.rank == 0:
        job = {"world_size": comm.size,
               "ranks": [from_bytes(p, f"save_job_state({path!r}): rank {r}'s state") for r, p in enumerate(parts)]}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        torch.save(job, path)


def load_job_state(compression, path: str) -> None:
    """Read ``path`` on rank 0 and load each rank's own part into its ``compression``.
    A collective: every rank calls it."""
    _run_guarded(_load, "load_job_state", compression, path)


def _load(compression, comm, path: str) -> None:
    k, rank = comm.size, comm.rank
    header, parts, failure = np.zeros(k + 1, dtype=np.int64), [], None
    if rank == 0:
        try:  # a failure here must reach every rank, not leave them waiting in the collective
            job = load_data(path, f"load_job_state({path!r})")
            if not isinstance(job, dict) or not isinstance(job.get("world_size"), int) or not isinstance(
                    job.get("ranks"), list) or (job["world_size"] == k and len(job["ranks"]) != k):
                raise ValueError("the file is not a job's compression state ({'world_size': K, 'ranks': [K states]})")
            header[0] = job["world_size"]
            if job["world_size"] == k:
                parts = [to_bytes(s) for s in job["ranks"]]
                header[1:] = [p.numel() for p in parts]
        except Exception as exc:  # noqa: BLE001 - reported on every rank below
            failure, header[0] = exc, (-2 if isinstance(exc, UnsafeCheckpointError) else -1)
    # rank 0's header (saved size, then each rank's byte count) to everyone
    headers = comm.allgather(torch.from_numpy(header).view(torch.uint8)) if k > 1 else torch.from_numpy(header).view(
        torch.uint8)[None]
    header = headers[0].view(torch.int64).numpy()
    if int(header[0]) == -2:   # the same class on every rank; rank 0's message names the refused object
        raise UnsafeCheckpointError(str(failure) if failure is not None else
                                    f"load_job_state({path!r}): refused by rank 0: the file holds an object other "
                                    "than tensors, numbers, strings and plain containers (a compression state is "
                                    "data, not code: read with torch.load(weights_only=True) only)")
    if int(header[0]) == -1:
        raise RuntimeError(f"load_job_state({path!r}): rank 0 could not read the file: "
                           + (f"{type(failure).__name__}: {failure}" if failure is not None else "see rank 0's error"))
    if int(header[0]) != k:
        raise ValueError(f"load_job_state({path!r}): the file holds the compression state of {int(header[0])} ranks; "
                         f"this job has {k}. The state cannot be redistributed to another number of ranks")
    counts = [int(c) for c in header[1:]]
    if k > 1:
        send = torch.cat(parts) if rank == 0 else torch.empty(0, dtype=torch.uint8)
        mine = comm.alltoallv(send, counts if rank == 0 else [0] * k, [counts[rank]] + [0] * (k - 1))
    else:
        mine = parts[0]
    compression.load_state_dict(from_bytes(mine, f"load_job_state({path!r}): rank {rank}'s part"))
