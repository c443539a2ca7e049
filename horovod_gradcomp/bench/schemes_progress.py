"""Does a request to a busy rank complete while that rank computes? (run under mpirun, 2+ ranks)

Rank 0 computes (torch matmuls, no MPI calls) for ``busy_s`` seconds in each of two phases;
rank 1 meanwhile reaches rank 0's memory, timing each access:

1. MPI one-sided, passive target: ``Lock(0)`` / ``Get`` / ``Accumulate`` / ``Unlock`` on a
   window made with ``Win.Allocate``;
2. the schemes' service thread: a pull of rank 0's shard of a :class:`ShardedCenter`.

An access that makes asynchronous progress takes milliseconds; one that does not waits
until rank 0 calls MPI again (about ``busy_s``). Prints one line per access kind.
"""
from __future__ import annotations

import time

import numpy as np
import torch


def _busy(seconds: float) -> None:
    a = torch.randn(256, 256)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a * 1e-3)


def run_probe(busy_s: float = 2.0, numel: int = 1 << 18, repeats: int = 3) -> dict:
    """Returns {kind: [seconds per access]} on rank 1 (empty dict on other ranks)."""
    from mpi4py import MPI
    import horovod_gradcomp as hgc

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("schemes progress probe: run with at least 2 ranks")
    result: dict = {}
    # 1. one-sided
    win = MPI.Win.Allocate(numel * 8, disp_unit=8, comm=comm)
    local = np.zeros(numel)
    comm.Barrier()
    times = []
    if rank == 0:
        _busy(busy_s)
    elif rank == 1:
        time.sleep(0.2)  # rank 0 is computing now
        for _ in range(repeats):
            t0 = time.perf_counter()
            win.Lock(0, MPI.LOCK_SHARED)
            win.Get([local, MPI.DOUBLE], 0)
            win.Accumulate([np.ones(numel), MPI.DOUBLE], 0, op=MPI.SUM)
            win.Unlock(0)
            times.append(time.perf_counter() - t0)
        result["one-sided Lock/Get/Accumulate/Unlock"] = times
    comm.Barrier()
    win.Free()
    # 2. service thread
    model = torch.nn.Linear(numel // size, size, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scheme = hgc.ADAG(model, opt, window=1_000_000)
    comm.Barrier()
    times = []
    if rank == 0:
        _busy(busy_s)
    elif rank == 1:
        time.sleep(0.2)
        buf = torch.empty(scheme.numel)
        for _ in range(repeats):
            t0 = time.perf_counter()
            scheme.client.center.pull(buf)
            times.append(time.perf_counter() - t0)
        result["service thread pull"] = times
    scheme.finish()
    return result
