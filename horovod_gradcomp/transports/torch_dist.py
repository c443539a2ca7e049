"""The communicator seam over ``torch.distributed`` (for the DDP comm hook).

:class:`TorchDistributedCommunicator` has the interface of
:class:`~horovod_gradcomp.exchange.communicator.MPICommunicator` and runs on its own gloo process group (the
exchange's byte buffers live on the CPU, whatever backend DDP itself uses), created by
``dist.new_group`` on every rank, so its collectives never pair with DDP's.

Gloo's allgather needs equal sizes on every rank: variable-size parts are padded to the
largest, which :meth:`allgatherv` reports in :attr:`padding_bytes` (the bytes sent beyond
the payloads), so statistics stay honest.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..exchange.communicator import _check_bytes, _counts, alltoallv_buffers


class TorchDistributedCommunicator:
    """Collectives on uint8 CPU tensors over a gloo group of ``torch.distributed``.

    Args:
        group: the process group to use (None: a new gloo group over all ranks, created
            here, so every rank must construct this object at the same point).
    """

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("TorchDistributedCommunicator: call torch.distributed.init_process_group first")
        self._dist = dist
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.padding_bytes = 0

    @property
    def rank(self) -> int:
        return self._dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return self._dist.get_world_size(self.group)

    def _gather_equal(self, send: torch.Tensor) -> torch.Tensor:
        """[K, *send.shape]: every rank's ``send`` (same shape everywhere)."""
        parts = [torch.empty_like(send) for _ in range(self.size)]
        self._dist.all_gather(parts, send.contiguous(), group=self.group)
        return torch.stack(parts)

    def _gather_padded(self, send: torch.Tensor, sizes: np.ndarray) -> list:
        """Every rank's uint8 part (rank k's has ``sizes[k]`` bytes), through one allgather
        padded to the largest part."""
        longest = int(sizes.max()) if sizes.size else 0
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:send.numel()] = send
        self.padding_bytes += (longest - send.numel()) * (self.size - 1)
        rows = self._gather_equal(padded)
        return [rows[k, :int(n)] for k, n in enumerate(sizes)]

    # -- the MPICommunicator interface ------------------------------------------------------
    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        """uint8[n] on every rank (same n everywhere) -> uint8[K, n], row k from rank k."""
        _check_bytes(send, "allgather")
        return self._gather_equal(send)

    def allgatherv(self, send: torch.Tensor) -> list:
        """uint8[n_k] on rank k (sizes may differ) -> [uint8[n_0], ..., uint8[n_{K-1}]].
        One allgather of the sizes, then one allgather padded to the largest size."""
        _check_bytes(send, "allgatherv")
        sizes = self._gather_equal(torch.tensor([send.numel()], dtype=torch.int64)).reshape(-1).numpy()
        return self._gather_padded(send, sizes)

    def alltoallv(self, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        """Personalized exchange (see :meth:`MPICommunicator.alltoallv`): one ``all_to_all_single``."""
        sc, rc, recv = alltoallv_buffers(send, send_counts, recv_counts, self.size)
        self._dist.all_to_all_single(recv, send, output_split_sizes=rc.tolist(), input_split_sizes=sc.tolist(),
                                     group=self.group)
        return recv

    def allgatherv_known(self, send: torch.Tensor, counts: Sequence[int]) -> list:
        """Allgather of parts whose sizes every rank knows (see
        :meth:`MPICommunicator.allgatherv_known`): one allgather padded to the largest part."""
        _check_bytes(send, "allgatherv_known")
        c = _counts(counts, self.size, "counts")
        if send.numel() != int(c[self.rank]):
            raise ValueError(f"allgatherv_known: rank {self.rank} sends {send.numel()} bytes, counts say "
                             f"{int(c[self.rank])}")
        return self._gather_padded(send, c)

    def allreduce_max(self, values: np.ndarray) -> np.ndarray:
        """Elementwise maximum over ranks of a float64 vector (one ``all_reduce``, MAX)."""
        t = torch.from_numpy(np.array(values, dtype=np.float64).reshape(-1))
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return t.numpy().reshape(np.shape(values))

    def __repr__(self) -> str:
        return f"TorchDistributedCommunicator(size={self.size})"
