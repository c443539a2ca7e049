"""A sparse DDP bucket's exchange: the mean of the ranks' sparse gradients, uncompressed.

DDP gives a sparse gradient (``nn.Embedding(sparse=True)``) a bucket of its own, whose buffer
is the sparse COO gradient itself. PyTorch's default hook allreduces it (gloo's sparse allreduce
allgathers every rank's indices and values and sums them); no codec applies to it.
:func:`sparse_job` does the same with the hook's communicator's byte allgathers, in its turn
among the buckets (the sequencer of :mod:`horovod_gradcomp.ddp.hook`): every rank's ``nnz``,
then its coalesced indices and values (:func:`pack`), summed in rank order (:func:`unpack_mean`:
the same bits on every rank) into the bucket's buffer, which DDP keeps. On NCCL the same code
runs from the current CUDA device (not run here: no GPU). A mean with a NaN or Inf makes the
whole step non-finite, as a dense bucket's would.
"""
from __future__ import annotations

import math
from typing import Generator, List, Sequence

import torch

from ..exchange.stats import allgather_wire_bytes
from ..exchange.requests import Collective


def is_sparse(t: torch.Tensor) -> bool:
    """True for a sparse COO tensor (DDP's sparse buckets)."""
    return t.layout == torch.sparse_coo


def _row_bytes(grad: torch.Tensor) -> int:
    """Bytes of one nonzero: its ``sparse_dim`` int64 indices and its dense slice of values."""
    dense = math.prod(grad.shape[grad.sparse_dim():])
    return 8 * grad.sparse_dim() + dense * grad.element_size()


def pack(local: torch.Tensor) -> torch.Tensor:
    """A coalesced sparse tensor's indices, then values, as flat uint8 bytes."""
    indices = local.indices().contiguous().reshape(-1).view(torch.uint8)
    values = local.values().contiguous().reshape(-1).view(torch.uint8)
    return torch.cat([indices.to(values.device), values])


def unpack_mean(parts: Sequence[torch.Tensor], nnzs: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """The mean of the K ranks' sparse tensors packed in ``parts`` (rank order): coalesced, on
    ``like``'s device, in its dtype."""
    sd, dense_shape = like.sparse_dim(), tuple(like.shape[like.sparse_dim():])
    indices: List[torch.Tensor] = []
    values: List[torch.Tensor] = []
    for part, n in zip(parts, nnzs):
        n = int(n)
        part = part.to(like.device).clone()   # own, aligned storage for the dtype views
        cut = 8 * sd * n
        indices.append(part[:cut].view(torch.int64).view(sd, n))
        values.append(part[cut:].view(like.dtype).view(n, *dense_shape))
    summed = torch.sparse_coo_tensor(torch.cat(indices, 1), torch.cat(values, 0), like.shape).coalesce()
    return torch.sparse_coo_tensor(summed.indices(), summed.values() / len(parts), like.shape).coalesce()


def sparse_job(comm, grad: torch.Tensor, engine) -> Generator[Collective, object, None]:
    """The bucket's collectives (a request sequence, :mod:`horovod_gradcomp.exchange.requests`, as the codec buckets' jobs): the
    mean over ranks written into ``grad`` (the bucket's sparse buffer); its bytes and a non-finite
    mean reported to ``engine`` (:meth:`~horovod_gradcomp.exchange.engine.StepEngine.record_sparse`)."""
    local = grad.detach().coalesce()
    send = pack(local)
    k = comm.size
    if k == 1:
        mean = torch.sparse_coo_tensor(local.indices(), local.values().clone(), local.shape).coalesce()
    else:
        nnzs = yield Collective("sizes", (local._nnz(),), comm, "sparse sizes")
        row = _row_bytes(local)
        parts = yield Collective("allgatherv_known", (send, [int(n) * row for n in nnzs]), comm, "sparse",
                                 last=True)
        mean = unpack_mean(parts, nnzs, local)
    with torch.no_grad():
        grad.copy_(mean)
    engine.record_sparse(numel=local.values().numel(), payload=send.numel(),
                         sent=allgather_wire_bytes(send.numel() + 8, k), k=k,
                         nonfinite=not bool(torch.isfinite(mean.values()).all()))


__all__ = ["is_sparse", "pack", "sparse_job", "unpack_mean"]
