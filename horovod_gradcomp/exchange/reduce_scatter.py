"""The compressed reduce-scatter pattern: every rank encodes its whole flat input, owner j decodes
the K payloads of chunk j and sums them.

The input of one call is a flat vector of ``K * S`` values laid out as K rank-chunks of S values
(FSDP2's reduce-scatter input: for rank 0, then rank 1, ..., every parameter's dim-0-padded shard,
concatenated). A :class:`ShardLayout` names the segments of a chunk (one per parameter, its padded
shard shape); every chunk has the same segments at the same offsets. Per call:

1. preamble: one allgather of the agreement digest and this rank's non-finite flag
   (:func:`~horovod_gradcomp.exchange.preamble.preamble_steps`); when any rank flagged, no
   payload is encoded or sent, the memory is left as it was, and the output is NaN on every rank;
2. [shared scales: one MAX-allreduce, TernGrad]; every segment of every chunk is encoded through
   the worker memory (error feedback or DGC) under the key ``"<param>[<chunk>]"``, so each segment
   has its own scales (per row for onebit) and its own residual; stochastic codecs draw from
   stream position ``step * P + index`` of the key (:class:`~horovod_gradcomp.exchange.stream_positions.StepPositions`);
3. one alltoallv: owner j receives every rank's payloads of chunk j (fixed-size codecs: the
   chunk's :class:`~horovod_gradcomp.exchange.fusion.FusedLayout`, the same size on every rank;
   variable-size codecs: an alltoallv of the parts' sizes first, parts in
   :func:`~horovod_gradcomp.exchange.fusion.pack_variable`'s format);
4. the owner decodes the K payloads of each of its segments and sums them in float32 (float64 for
   fp64), times ``scale``, into the output (in the input's dtype): the result is decoded once,
   never quantized again.

A codec's dense warm-up steps (``warmup_steps``) go through :func:`dense_reduce_scatter_job`
instead: the same alltoallv of the raw chunks and an fp32 sum in rank order.

Each job is a request sequence (:mod:`horovod_gradcomp.exchange.requests`: it yields
:class:`~horovod_gradcomp.exchange.requests.Collective` s and is resumed with their results), run
by any driver of those requests (FSDP2's hook: the blocking driver); it returns a
:class:`ReduceScatterOutcome`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Sequence, Tuple

import torch

from ..codecs.base import Codec
from .fusion import FusedLayout, pack_variable, unpack_variable
from .preamble import PREAMBLE_BYTES, has_nonfinite, preamble_steps
from .requests import Collective, Steps
from .scale_agreement import agree_scales
from .stream_positions import StepPositions
from .stats import ExchangeStats, StepTotals, allgather_wire_bytes
from .stripes import stripe_key


@dataclass(frozen=True)
class Segment:
    """One parameter's padded shard inside a rank-chunk: ``numel`` values from ``offset``."""
    name: str
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return self.shape.numel()


class ShardLayout:
    """The segments of one rank-chunk of a flat reduce-scatter input over ``world_size`` ranks.

    ``shards``: ``(name, padded shard shape)`` in the order of the input (the parameter group's
    order). Fields: segments, chunk_numel (S), world_size (K), numel (K * S)."""

    def __init__(self, shards: Sequence[Tuple[str, Sequence[int]]], world_size: int):
        if world_size < 1:
            raise ValueError(f"ShardLayout: world_size must be >= 1, got {world_size}")
        names = [n for n, _ in shards]
        if len(set(names)) != len(names):
            raise ValueError(f"ShardLayout: parameter names repeat: {names}")
        self.segments: List[Segment] = []
        offset = 0
        for name, shape in shards:
            seg = Segment(name, torch.Size(shape), offset)
            self.segments.append(seg)
            offset += seg.numel
        self.chunk_numel = offset
        self.world_size = world_size
        self.numel = offset * world_size

    def keys(self, chunk: int) -> List[str]:
        """The memory keys of chunk ``chunk``'s segments: ``"<name>[<chunk>]"``."""
        return [stripe_key(s.name, chunk) for s in self.segments]

    def views(self, flat: torch.Tensor, chunk: int) -> List[torch.Tensor]:
        """Chunk ``chunk``'s segments of ``flat`` (a K*S input) or of a chunk-sized vector
        (``chunk`` ignored), each a contiguous view in its shard shape."""
        base = 0 if flat.numel() == self.chunk_numel else chunk * self.chunk_numel
        return [flat[base + s.offset: base + s.offset + s.numel].view(s.shape) for s in self.segments]

    def check(self, input_tensor: torch.Tensor, output_tensor: torch.Tensor, owner: str) -> None:
        """Raise ValueError unless the tensors are the flat contiguous input and output of this layout."""
        ok = (input_tensor.dim() == 1 and output_tensor.dim() == 1 and input_tensor.numel() == self.numel
              and output_tensor.numel() == self.chunk_numel and input_tensor.is_contiguous()
              and output_tensor.is_contiguous() and input_tensor.dtype == output_tensor.dtype)
        if not ok:
            raise ValueError(
                f"{owner}: expected a flat contiguous input of {self.numel} values and an output of {self.chunk_numel} "
                f"of one dtype (K={self.world_size} chunks of the padded shards of {[s.name for s in self.segments]}), "
                f"got input {tuple(input_tensor.shape)} {input_tensor.dtype} and output {tuple(output_tensor.shape)} "
                f"{output_tensor.dtype}; did the parameters FSDP reduces change since register()?")


@dataclass
class ReduceScatterOutcome:
    """What one call did: ``payload`` bytes this rank encoded (all K chunks), ``sent`` wire bytes
    this rank sent (preamble, scales, sizes, the payloads to the other owners), ``nonfinite``:
    some rank flagged a NaN or Inf (the output is NaN)."""
    payload: int
    sent: float
    nonfinite: bool = False


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _checked_preamble(comm, layout: ShardLayout, input_tensor: torch.Tensor, output_tensor: torch.Tensor,
                      signature: Sequence[str], owner: str, check: bool, stats: ExchangeStats) -> Steps:
    """Both jobs' start: check the tensors against ``layout``, measure this rank's input and run
    the preamble. Returns True when some rank's input is not finite; the output is then all NaN."""
    layout.check(input_tensor, output_tensor, owner)
    with stats.timed("encode_s", "check"):
        local_nonfinite = has_nonfinite({"input": input_tensor})
    nonfinite = yield from preamble_steps(comm, owner, signature, local_nonfinite, check, stats)
    if nonfinite:
        output_tensor.fill_(float("nan"))
    return nonfinite


def reduce_scatter_job(codec: Codec, memory, comm, layout: ShardLayout, input_tensor: torch.Tensor,
                       output_tensor: torch.Tensor, *, scale: float, step: int, order: Mapping[str, int],
                       signature: Sequence[str], owner: str, check: bool, stats: ExchangeStats
                       ) -> Steps:
    """The compressed reduce-scatter of ``input_tensor`` into ``output_tensor`` (see the module doc).

    ``memory``: the worker memory (``encode_many(codec, keys, tensors, options, positions)``);
    ``scale``: the factor of the owner's sum (1/K for a mean, 1 for a sum); ``step`` and ``order``
    (key -> index over every key the memory will see) position stochastic codecs' streams;
    ``signature``: what the ranks must agree on (checked in the preamble when ``check``)."""
    k, rank = comm.size, comm.rank
    if k != layout.world_size:
        raise ValueError(f"{owner}: the group has {k} ranks, the layout was built for {layout.world_size}")
    totals = StepTotals(k=k)
    sent = allgather_wire_bytes(PREAMBLE_BYTES, k)
    if (yield from _checked_preamble(comm, layout, input_tensor, output_tensor, signature, owner, check, stats)):
        return ReduceScatterOutcome(0, sent, nonfinite=True)

    keys = [key for j in range(k) for key in layout.keys(j)]
    grads = [v for j in range(k) for v in layout.views(input_tensor, j)]
    options = yield from agree_scales(codec, comm, keys,
                                      lambda: [memory.compensated(n, g) for n, g in zip(keys, grads)], stats, totals)
    positions = StepPositions(step, order)
    with stats.timed("encode_s"):
        payloads = memory.encode_many(codec, keys, grads, options, [positions(n) for n in keys])
    by_chunk = [dict(zip([s.name for s in layout.segments], payloads[j * len(layout.segments):
                                                                    (j + 1) * len(layout.segments)]))
                for j in range(k)]
    names = [s.name for s in layout.segments]
    outs = layout.views(output_tensor, rank)
    if codec.variable_size:
        with stats.timed("exchange_s"):
            parts = [pack_variable(names, by_chunk[j]) for j in range(k)]
            counts = [p.numel() for p in parts]
            mine = torch.tensor(counts, dtype=torch.int64)
        got = yield Collective("alltoallv", (_byte_view(mine), [8] * k, [8] * k), comm, "sizes")
        recv_counts = got.cpu().view(torch.int64).tolist()
        recv = yield Collective("alltoallv", (torch.cat(parts), counts, recv_counts), comm, "payload",
                                 last=True)
        with stats.timed("decode_s"):
            pieces = torch.split(recv, recv_counts)
            decoded = [unpack_variable(piece, names, by_chunk[rank]) for piece in pieces]
            codec.decode_mean_list_many([[d[n] for d in decoded] for n in names], scale=scale, outs=outs)
        payload = sum(counts)
        sent += 8 * (k - 1) + sum(c for j, c in enumerate(counts) if j != rank)
    else:
        fused = FusedLayout(codec, [(s.name, s.shape, input_tensor.dtype) for s in layout.segments])
        with stats.timed("exchange_s"):
            send = torch.cat([fused.pack(by_chunk[j]) for j in range(k)])
        n = fused.nbytes
        recv = yield Collective("alltoallv", (send, [n] * k, [n] * k), comm, "payload", last=True)
        with stats.timed("decode_s"):
            stacked = fused.unpack(recv.view(k, n), {s.name: input_tensor.device for s in layout.segments})
            codec.decode_mean_stacked_many([p for _, p in stacked], scale=scale, outs=outs)
        payload = k * n
        sent += (k - 1) * n
    return ReduceScatterOutcome(payload, sent + totals.sent)


def dense_reduce_scatter_job(comm, layout: ShardLayout, input_tensor: torch.Tensor, output_tensor: torch.Tensor,
                             *, scale: float, signature: Sequence[str], owner: str, check: bool,
                             stats: ExchangeStats) -> Steps:
    """The uncompressed reduce-scatter of a codec's warm-up steps: the preamble, one alltoallv of
    the raw chunks, and the owner's float32 (float64 for fp64) sum in rank order, times ``scale``.
    The memory is not touched."""
    k = comm.size
    sent = allgather_wire_bytes(PREAMBLE_BYTES, k)
    if (yield from _checked_preamble(comm, layout, input_tensor, output_tensor, signature, owner, check, stats)):
        return ReduceScatterOutcome(0, sent, nonfinite=True)
    n = layout.chunk_numel * input_tensor.element_size()
    recv = yield Collective("alltoallv", (_byte_view(input_tensor), [n] * k, [n] * k), comm, "payload",
                            last=True)
    with stats.timed("decode_s"):
        rows = recv.to(input_tensor.device).view(input_tensor.dtype).view(k, -1)
        acc_dtype = torch.float64 if input_tensor.dtype == torch.float64 else torch.float32
        acc = torch.zeros(layout.chunk_numel, dtype=acc_dtype, device=input_tensor.device)
        for r in range(k):
            acc.add_(rows[r].to(acc_dtype))
        output_tensor.copy_(acc.mul_(scale))
    return ReduceScatterOutcome(k * n, sent + (k - 1) * n)


def memory_keys(layout: ShardLayout) -> List[str]:
    """Every key the memory sees for this layout, chunk by chunk."""
    return [key for j in range(layout.world_size) for key in layout.keys(j)]
