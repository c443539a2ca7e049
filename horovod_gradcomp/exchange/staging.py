"""Staging of a bucket's fused payload bytes between the device that encoded them and MPI.

MPI (mpi4py on the package's communicator) reads and writes host memory. Payloads encoded on a
GPU reach it in one step per bucket:

* send: the buffers are concatenated on the device into one device buffer, copied to the host
  buffer MPI will read with one asynchronous copy on the current stream, and an event recorded
  after it; :meth:`Staging.gather` returns once that event has completed (never a
  ``synchronize()`` of the whole device);
* receive: the host receive buffer is copied to the device in one asynchronous copy on the
  current stream, and payload views are cut from the device copy (work queued after it on the
  same stream sees the bytes; nothing waits on the host).

CPU tensors (the CPU kernels and the OpenMP twin of the device kernels) take :class:`HostStaging`,
which makes no copy at all beyond the concatenation: that is the path the CPU tests execute, so
only the CUDA copies and the event of :class:`CudaStaging` have not run in CI (no GPU).

A CUDA-aware MPI (Open MPI's ``MPIX_Query_cuda_support``, mpi4py's ``MPI.Query_cuda_support``)
could take the device buffer directly; :func:`cuda_aware_mpi` reports it, but the exchange stages
through the host in every case for now (the direct path is not written).
"""
from __future__ import annotations

from typing import Sequence

import torch


class HostStaging:
    """Payloads already in host memory: the concatenation writes straight into MPI's buffer,
    received bytes are used where MPI wrote them."""

    device = torch.device("cpu")
    copies = 0  # host <-> device copies issued (none here; CudaStaging counts its own)

    def gather(self, parts: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Concatenate the uint8 ``parts`` into the host tensor ``out`` (its first bytes)."""
        if parts:
            torch.cat(list(parts), out=out[:sum(p.numel() for p in parts)])
        return out

    def scatter(self, recv: torch.Tensor) -> torch.Tensor:
        """The received host bytes, on this staging's device: ``recv`` itself."""
        return recv


class CudaStaging:
    """Payloads on one CUDA device: one device concatenation and one copy per bucket and
    direction, ordered by the current stream and an event (see the module doc)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.copies = 0

    def gather(self, parts: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        if not parts:
            return out
        with torch.cuda.device(self.device):
            fused = torch.cat([p.to(self.device) for p in parts])
            stream = torch.cuda.current_stream(self.device)
            out[:fused.numel()].copy_(fused, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
            done.synchronize()  # MPI reads `out` next: wait for this copy only
            self.copies += 1
        return out

    def scatter(self, recv: torch.Tensor) -> torch.Tensor:
        with torch.cuda.device(self.device):
            self.copies += 1
            return recv.to(self.device, non_blocking=True)


def staging_for(device: torch.device):
    """The staging of payloads encoded on ``device``: host staging for the CPU, one
    :class:`CudaStaging` per CUDA device otherwise."""
    device = torch.device(device)
    if device.type == "cpu":
        return _HOST
    if device.type == "cuda":
        return CudaStaging(device)
    raise ValueError(f"horovod_gradcomp: payloads on {device} cannot be exchanged (CPU or CUDA tensors only)")


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


_HOST = HostStaging()
