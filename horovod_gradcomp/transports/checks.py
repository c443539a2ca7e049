"""The argument checks every transport makes: byte buffers, per-rank byte counts, groups.

A collective of the :class:`~horovod_gradcomp.transports.interface.Communicator` interface takes
flat uint8 tensors and, for the uneven ones, one byte count per rank; a split takes groups that
partition the ranks. These functions vet them the same way in every transport and raise an error
naming the collective and the problem.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch


def check_bytes(send: torch.Tensor, what: str, host_only: bool = True) -> None:
    """Raise TypeError unless ``send`` is a flat uint8 tensor (in host memory when ``host_only``)."""
    if not isinstance(send, torch.Tensor) or send.dtype != torch.uint8 or send.dim() != 1:
        raise TypeError(f"{what} expects a flat uint8 {'CPU ' if host_only else ''}tensor, got "
                        f"{getattr(send, 'dtype', type(send).__name__)} {tuple(getattr(send, 'shape', ()))}")
    if host_only and send.device.type != "cpu":
        raise TypeError(f"{what} expects a flat uint8 CPU tensor, got one on {send.device}")


def byte_counts(counts: Sequence[int], size: int, what: str) -> np.ndarray:
    """``counts`` as an int64 vector of one non-negative entry per rank (ValueError otherwise)."""
    c = np.asarray(list(counts), dtype=np.int64)
    if c.shape != (size,) or (c < 0).any():
        raise ValueError(f"{what}: expected {size} non-negative byte counts, got {list(counts)}")
    return c


def displacements(counts: np.ndarray) -> np.ndarray:
    """Offsets of back-to-back parts of the given sizes."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def known_counts(send: torch.Tensor, counts: Sequence[int], rank: int, size: int) -> np.ndarray:
    """The checked counts of an ``allgatherv_known``: one per rank, and this rank's part
    (``send``) exactly ``counts[rank]`` bytes (ValueError otherwise)."""
    c = byte_counts(counts, size, "counts")
    if send.numel() != int(c[rank]):
        raise ValueError(f"allgatherv_known: rank {rank} sends {send.numel()} bytes, counts say {int(c[rank])}")
    return c


def alltoallv_counts(send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                     size: int) -> Tuple[np.ndarray, np.ndarray]:
    """The checked ``(send_counts, recv_counts)`` of an ``alltoallv`` among ``size`` ranks: one
    count per rank each, and the send counts summing to the bytes of ``send`` (ValueError otherwise)."""
    sc, rc = byte_counts(send_counts, size, "send_counts"), byte_counts(recv_counts, size, "recv_counts")
    if int(sc.sum()) != send.numel():
        raise ValueError(f"alltoallv: send holds {send.numel()} bytes, send_counts sum to {int(sc.sum())}")
    return sc, rc


def split_parts(flat: torch.Tensor, sizes: np.ndarray) -> list:
    """Views of ``flat`` cut into back-to-back parts of the given sizes."""
    return [flat[int(o):int(o) + int(n)] for o, n in zip(displacements(sizes), sizes)]


def group_of(groups: Sequence[Sequence[int]], rank: int, size: int) -> Tuple[int, int]:
    """``(index of the group holding rank, rank's place in it)``, after checking that ``groups``
    partition ``range(size)`` (ValueError naming the problem otherwise)."""
    seen = sorted(r for g in groups for r in g)
    if seen != list(range(size)):
        raise ValueError(f"split: the groups {[list(g) for g in groups]} do not partition the {size} ranks")
    for i, g in enumerate(groups):
        if rank in g:
            return i, list(g).index(rank)
    raise AssertionError("unreachable: the groups partition every rank")


__all__ = ["alltoallv_counts", "byte_counts", "check_bytes", "displacements", "group_of", "known_counts", "split_parts"]
