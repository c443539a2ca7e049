"""Staging of a bucket's fused payload bytes between the device that encoded them and MPI.

One staging object per (payload device, wire device), where the *wire device* holds the buffers
the communicator hands to MPI and MPI writes received bytes into:

* :class:`DirectStaging` (wire device = payload device): the concatenation writes straight into
  the buffer MPI reads, and received bytes are used where MPI wrote them; no copy at all. On the
  CPU this is the host staging (:class:`HostStaging`, what every CPU test executes). On a CUDA
  device it is the *direct path* for a CUDA-aware MPI (:mod:`horovod_gradcomp.transports.mpi`,
  which takes device buffers): MPI does not order its reads with CUDA streams, so before MPI
  reads the buffer the staging waits on the host for an event recorded after the concatenation
  on the current stream (that event only, never a ``synchronize()`` of the whole device).
* :class:`CudaStaging` (payloads on CUDA, wire in host memory): the buffers are concatenated on
  the device, copied to the (pinned) host buffer MPI will read with one asynchronous copy on the
  current stream, and an event recorded after it; :meth:`CudaStaging.gather` returns once that
  event has completed. Receive: one asynchronous copy to the device on the current stream;
  payload views are cut from the device copy (work queued after it on the stream sees the bytes).

Which one: :func:`staging_for` (sending) and :func:`staging_into` (received bytes, cut by the
staging that matches where they are). Horovod's and torch.distributed's communicators take no
device buffers, so they always get host buffers.

What has run: every CPU exchange (:class:`DirectStaging`, counters tested) and the choice of class;
the CUDA copies and events, and MPI on device memory, only in ``ci/gpu_exchange_check.py`` (a GPU).
"""
from __future__ import annotations

import threading
from typing import Dict, Sequence, Tuple

import torch

from ..transports.interface import DeviceBufferCommunicator
from ..transports.mpi import ready_for_mpi
from .env import flag_from_env

#: Set to 1 to stage CUDA payloads through host memory even when MPI is CUDA-aware.
HOST_STAGING_ENV = "HOROVOD_GRADCOMP_HOST_STAGING"


class _Counted:
    """Counters of a staging object (process-wide for the shared instances; read them as
    differences): ``gathers`` and ``scatters`` (calls), ``copies`` (host <-> device copies
    issued), ``waits`` (host waits on a stream event before MPI touches device memory)."""

    def _init_counters(self) -> None:
        self._lock = threading.Lock()
        self.gathers = self.scatters = self.copies = self.waits = 0

    def _count(self, gathers: int = 0, scatters: int = 0, copies: int = 0, waits: int = 0) -> None:
        with self._lock:
            self.gathers += gathers
            self.scatters += scatters
            self.copies += copies
            self.waits += waits

    def counters(self) -> Dict[str, int]:
        with self._lock:
            return {"gathers": self.gathers, "scatters": self.scatters, "copies": self.copies, "waits": self.waits}


def _check_out(out: torch.Tensor, parts: Sequence[torch.Tensor], wire: torch.device) -> int:
    """Bytes of ``parts``; raises when ``out`` is not a flat uint8 tensor on ``wire`` that holds them."""
    nbytes = sum(p.numel() for p in parts)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 1:
        raise ValueError(f"staging: the output must be a flat uint8 tensor, got {getattr(out, 'dtype', type(out))}")
    if out.device != wire:
        raise ValueError(f"staging: the output is on {out.device}, this staging writes MPI's bytes on {wire}")
    if out.numel() < nbytes:
        raise ValueError(f"staging: {nbytes} bytes of payload do not fit an output of {out.numel()} bytes")
    return nbytes


class DirectStaging(_Counted):
    """Payloads and MPI's buffers on one device (``device``: the CPU, or a CUDA device with a
    CUDA-aware MPI): no copy; on CUDA one host wait on an event before MPI reads the buffer."""

    def __init__(self, device):
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"horovod_gradcomp: payloads on {self.device} cannot be exchanged (CPU or CUDA only)")
        self.wire_device = self.device
        self._init_counters()

    def empty(self, nbytes: int) -> torch.Tensor:
        """An uninitialized uint8 buffer of ``nbytes`` where MPI will read it (on ``device``)."""
        return torch.empty(int(nbytes), dtype=torch.uint8, device=self.wire_device)

    def gather(self, parts: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Concatenate the uint8 ``parts`` into the first bytes of ``out`` (on ``device``) and
        return ``out`` once MPI may read them (on CUDA: the current stream's work up to the
        concatenation has completed). A part on another device is moved first (counted as a copy)."""
        nbytes = _check_out(out, parts, self.wire_device)
        moved = [p if p.device == self.device else p.to(self.device) for p in parts]
        copies = sum(1 for p, m in zip(parts, moved) if m is not p)
        if moved:
            torch.cat(moved, out=out[:nbytes])
        waits = 0
        if self.device.type == "cuda":
            ready_for_mpi(self.device)
            waits = 1
        self._count(gathers=1, copies=copies, waits=waits)
        return out

    def scatter(self, recv: torch.Tensor) -> torch.Tensor:
        """The received bytes for payloads on ``device``: ``recv`` itself (MPI wrote them there)."""
        if recv.device != self.device:
            raise ValueError(f"DirectStaging({self.device}): received bytes are on {recv.device}")
        self._count(scatters=1)
        return recv

    def __repr__(self) -> str:
        return f"DirectStaging({str(self.device)!r})"


class HostStaging(DirectStaging):
    """Payloads already in host memory (:class:`DirectStaging` on the CPU)."""

    def __init__(self):
        super().__init__("cpu")

    def __repr__(self) -> str:
        return "HostStaging()"


class CudaStaging(_Counted):
    """Payloads on one CUDA device, MPI's buffers in host memory: one device concatenation and
    one copy per bucket and direction, ordered by the current stream and an event (module doc).
    Runs only with a GPU."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.wire_device = torch.device("cpu")
        self._init_counters()

    def empty(self, nbytes: int) -> torch.Tensor:
        """A pinned host buffer of ``nbytes`` (so that the device-to-host copy is asynchronous)."""
        return torch.empty(int(nbytes), dtype=torch.uint8, pin_memory=True)

    def gather(self, parts: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Concatenate ``parts`` on the device and copy them into the first bytes of the host
        tensor ``out``; returns once that copy has completed."""
        nbytes = _check_out(out, parts, self.wire_device)
        if not parts:
            return out
        with torch.cuda.device(self.device):
            fused = torch.cat([p.to(self.device) for p in parts])
            stream = torch.cuda.current_stream(self.device)
            out[:nbytes].copy_(fused, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
            done.synchronize()  # MPI reads `out` next: wait for this copy only
        self._count(gathers=1, copies=1, waits=1)
        return out

    def scatter(self, recv: torch.Tensor) -> torch.Tensor:
        """The received host bytes on the device: one asynchronous copy on the current stream."""
        if recv.device.type != "cpu":
            raise ValueError(f"CudaStaging({self.device}): received bytes are on {recv.device}, expected host memory")
        with torch.cuda.device(self.device):
            self._count(scatters=1, copies=1)
            return recv.to(self.device, non_blocking=True)

    def __repr__(self) -> str:
        return f"CudaStaging({str(self.device)!r})"


def staging_for(device, comm=None):
    """The staging of payloads encoded on ``device`` and sent through ``comm``: the host staging
    for the CPU; for a CUDA device :class:`DirectStaging` when ``comm`` takes buffers on it and
    :data:`HOST_STAGING_ENV` does not force the host, else :class:`CudaStaging`. One shared
    instance per kind and device."""
    device = _payload_device(device)
    if device.type == "cpu":
        return _HOST
    if (not flag_from_env(HOST_STAGING_ENV) and isinstance(comm, DeviceBufferCommunicator)
            and comm.takes_device_buffers(device)):
        return _shared(DirectStaging, device)
    return _shared(CudaStaging, device)


def staging_into(device, wire_device):
    """The staging between payloads on ``device`` and bytes on ``wire_device`` (where an output
    buffer was allocated, or where received bytes are): :class:`DirectStaging` when they are the
    same device, :class:`CudaStaging` for CUDA payloads and host bytes; anything else raises
    ValueError."""
    device, wire = _payload_device(device), torch.device(wire_device)
    if wire == device:
        return _HOST if device.type == "cpu" else _shared(DirectStaging, device)
    if wire.type == "cpu" and device.type == "cuda":
        return _shared(CudaStaging, device)
    raise ValueError(f"horovod_gradcomp: bytes on {wire} cannot be staged for payloads on {device} "
                     "(the wire buffers are either host memory or the payloads' own device)")


def _payload_device(device) -> torch.device:
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"horovod_gradcomp: payloads on {device} cannot be exchanged (CPU or CUDA tensors only)")
    if device.type == "cuda" and device.index is None:  # tensors' devices carry an index: compare like them
        device = torch.device("cuda", torch.cuda.current_device())
    return device


_SHARED: Dict[Tuple[type, torch.device], object] = {}
_SHARED_LOCK = threading.Lock()


def _shared(kind: type, device: torch.device):
    with _SHARED_LOCK:
        found = _SHARED.get((kind, device))
        if found is None:
            found = _SHARED[(kind, device)] = kind(device)
        return found


_HOST = HostStaging()

__all__ = ["CudaStaging", "DirectStaging", "HOST_STAGING_ENV", "HostStaging", "staging_for", "staging_into"]
