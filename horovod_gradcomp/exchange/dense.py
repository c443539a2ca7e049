"""The dense pattern: a bucket averaged at full precision (used for a codec's warm-up steps).

A codec with ``warmup_steps = N > 0`` (onebit's option) has its first N steps exchanged
here instead of through its own payloads: the bucket's gradients, flattened into one float32
vector (float64 if any gradient is fp64), are averaged over ranks by a reduce-scatter and an
allgather built from the communicator's ``alltoallv`` and ``allgatherv_known``: rank j receives
slice j of every rank's vector, sums the K slices in rank order (so every rank gets bitwise the
same mean), and the means are gathered back. A rank sends ``2 (K-1)/K`` times the bucket's
dense bytes, what a ring allreduce sends (``bytes_dense`` in :mod:`.stats`).

The worker memory is not touched: no residual is read, created or updated, so error feedback
starts from zero at step N (residuals are created as zeros at their first encode).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from .bucket import Bucket, BucketOutcome, result_tensor
from .requests import Collective, Steps
from .stats import ExchangeStats, StepTotals
from .stripes import balanced_ranges


def mean_in_rank_order(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The mean of ``parts``, summed in their order (rank order: the same bits on every rank)."""
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total.div_(len(parts))


class DensePattern:
    """Full-precision mean of a bucket (see the module doc). Stateless: :meth:`steps` runs the
    three steps below around the two collectives."""

    name = "dense"

    @staticmethod
    def memory_keys(names: Sequence[str], rank: int) -> Tuple[List[str], List[str]]:
        """(worker, owner) memory keys a bucket may change (:mod:`.patterns`): none, the dense mean keeps no state."""
        return [], []

    @staticmethod
    def prepare(comm, bucket: Bucket, stats: ExchangeStats) -> tuple:
        """The bucket as one flat vector: ``(flat, send, send_counts, recv_counts)`` for the alltoallv."""
        names, grads, k = bucket.names, bucket.grads, comm.size
        wire = torch.float64 if any(grads[n].dtype == torch.float64 for n in names) else torch.float32
        with stats.timed("exchange_s"):
            flat = torch.cat([grads[n].detach().reshape(-1).to(device="cpu", dtype=wire) for n in names])
        counts = [(b - a) * flat.element_size() for a, b in balanced_ranges(flat.numel(), k)]
        return flat, flat.view(torch.uint8), counts, [counts[comm.rank]] * k

    @staticmethod
    def reduce(comm, flat: torch.Tensor, recv: torch.Tensor, stats: ExchangeStats) -> tuple:
        """This rank's slice of the mean from the K received slices (summed in rank order):
        ``(send, counts)`` for the allgatherv."""
        k, item = comm.size, flat.element_size()
        counts = [(b - a) * item for a, b in balanced_ranges(flat.numel(), k)]
        with stats.timed("decode_s"):
            mine = mean_in_rank_order(recv.view(flat.dtype).reshape(k, counts[comm.rank] // item))
        return mine.view(torch.uint8), counts

    @staticmethod
    def finish(comm, bucket: Bucket, flat: torch.Tensor, gathered, stats: ExchangeStats) -> BucketOutcome:
        """The gathered slices written into each gradient's result tensor."""
        k, rank = comm.size, comm.rank
        results, offset = {}, 0
        with stats.timed("decode_s"):
            mean = torch.cat([g.view(flat.dtype) for g in gathered])
            for n in bucket.names:
                g = bucket.grads[n]
                out = result_tensor(g, bucket.outs.get(n))
                out.copy_(mean[offset:offset + g.numel()].view(g.shape))
                offset += g.numel()
                results[n] = out
        payload = flat.numel() * flat.element_size()
        mine = len(gathered[rank]) if k > 1 else payload
        sent = float(payload - mine + (k - 1) * mine) if k > 1 else 0.0  # alltoallv + allgatherv
        return BucketOutcome(results, payload, sent, {"k": k})

    def steps(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals, overlap: bool = False) -> Steps:
        """The exchange as a request sequence (:mod:`.requests`; ``totals``, ``overlap``: unused).
        Results: name -> mean over ranks of the gradients (cast back to each gradient's dtype,
        bitwise equal on every rank); ``payload``: this rank's dense bytes; ``sent``: what the two
        collectives sent (``2 (K-1)/K`` of the payload when K divides its length)."""
        flat, send, send_counts, recv_counts = self.prepare(comm, bucket, stats)
        if comm.size == 1:
            return self.finish(comm, bucket, flat, [send], stats)
        recv = yield Collective("alltoallv", (send, send_counts, recv_counts), comm)
        part, counts = self.reduce(comm, flat, recv, stats)
        gathered = yield Collective("allgatherv_known", (part, counts), comm, "owners", last=True)
        return self.finish(comm, bucket, flat, gathered, stats)

__all__ = ["DensePattern", "mean_in_rank_order"]
