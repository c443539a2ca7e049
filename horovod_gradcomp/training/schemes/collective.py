"""Collective helpers of the synchronous schemes (on the scheme's duplicated communicator)."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from .base import Scheme, mpi_type


def allgather_messages(scheme: Scheme, message: np.ndarray) -> List[np.ndarray]:
    """Every rank's uint8 message (sizes may differ), in rank order. Counts the bytes this
    rank sends (its message once per peer) and receives (the others' messages)."""
    from mpi4py import MPI
    comm = scheme.comm
    sizes = np.empty(scheme.size, dtype=np.int64)
    comm.Allgather([np.asarray([message.size], dtype=np.int64), MPI.INT64_T], [sizes, MPI.INT64_T])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    recv = np.empty(int(sizes.sum()), dtype=np.uint8)
    comm.Allgatherv([np.ascontiguousarray(message), MPI.BYTE], [recv, (sizes, offsets), MPI.BYTE])
    scheme.count("bytes_sent", int(message.size) * (scheme.size - 1))
    scheme.count("bytes_received", int(sizes.sum() - message.size))
    return [recv[int(o):int(o) + int(n)] for o, n in zip(offsets, sizes)]


def allreduce_sum(scheme: Scheme, flat: torch.Tensor) -> torch.Tensor:
    """Sum of every rank's flat vector (dense). Counts the bytes of a ring allreduce:
    2 (K-1)/K of the vector sent and as much received."""
    from mpi4py import MPI
    out = torch.empty_like(flat)
    scheme.comm.Allreduce([flat.contiguous().numpy(), mpi_type(flat.dtype)], [out.numpy(), mpi_type(flat.dtype)],
                          op=MPI.SUM)
    k = scheme.size
    moved = int(2 * (k - 1) * flat.numel() * flat.element_size() // k)
    scheme.count("bytes_sent", moved)
    scheme.count("bytes_received", moved)
    return out


def broadcast_(scheme: Scheme, flat: torch.Tensor, root: int = 0) -> torch.Tensor:
    """Overwrite ``flat`` with root's (makes every rank bitwise equal)."""
    scheme.comm.Bcast([flat.numpy(), mpi_type(flat.dtype)], root=root)
    return flat
