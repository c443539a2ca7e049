"""Two-phase compressed exchange: every rank owns 1/K of every tensor (Seide et al. 2014, 4.1).

One call of :meth:`TwoPhaseExchange.exchange` on every rank (same tensors, same order):

1. Worker side. Each tensor is cut into K stripes (:mod:`horovod_gradcomp.exchange.stripes`; stripe s
   belongs to rank s). Rank k compensates stripe s with the matching part of its own residual
   (``state.memory.residual(name, grad)``: one full-size residual per tensor, as in the allgather
   pattern, so checkpoints and the error-feedback identity do not depend on K) and encodes it:
   ``v = g_s + r_s;  q = encode(v);  r_s <- v - decode(q)`` (the same
   :func:`~horovod_gradcomp.state.error_feedback.encode_with_residual` as whole tensors).
   Codecs with a ``shared_scale`` (TernGrad) encode stripe s with ``s = max over ranks of
   codec.local_scale(v)``: all stripes' scales in one MAX-allreduce
   (:func:`~horovod_gradcomp.exchange.encoding.agree_scales`).
2. Alltoallv: rank k sends owner j the fused payloads of stripe j of every tensor (tensor
   order, one :class:`~horovod_gradcomp.exchange.fusion.FusedLayout` per owner; sizes come from the
   layouts, which every rank computes alike, so no size exchange).
3. Owner side: rank j decodes the mean over ranks of each stripe it owns
   (``codec.decode_mean_stacked`` of the K stacked payloads), adds its owner residual
   (``state.owner_memory``, keyed ``f"{name}[{j}]"``, enabled iff the worker feedback is) and
   encodes it again with the same codec (a shared-scale codec uses the owner's own
   ``local_scale``: there is one sender, nothing to agree on).
4. Allgatherv of the owners' payloads (sizes known); every rank decodes every stripe into
   its part of the result. Each gradient is thus quantized twice; every rank gets bitwise
   the same result (all decode the same bytes).

Stream positions (:mod:`horovod_gradcomp.exchange.encoding`, S = K stripes, F = 2 phases):
the worker encode of stripe s is phase 0, the owner's requantization phase 1, each drawn from
the encoding rank's own stream (its codec's ``rank_stream``; the owner of stripe s is rank s).

Striping axis (``axis``): ``"rows"`` cuts the 2-D view ``[shape[0], -1]`` by rows
(contiguous, no copies). A per-column codec (onebit: two float32 values per column) then
repeats every column's values in all K stripes, so its per-rank traffic would grow with K
(``16 * (K-1) * cols`` bytes per tensor in all), against the method's point. ``"auto"`` (the
default) therefore picks, per tensor and from the codec's layout alone (the same choice on
every rank), ``"columns"`` when the tensor is >= 2-D, has at least K columns and column
stripes save at least 8 bytes per stripe; ``"rows"`` otherwise. TernGrad and QSGD never save
that much (one scale per stripe, one partial bucket per stripe), so they stay on rows.
Column stripes cost a strided copy in and out; onebit's reconstruction values are then
exactly per column of the whole tensor, as in the paper (whose matrices are column-major).

Other choices: TernGrad's optional clipping and QSGD's buckets apply per stripe (buckets
restart at each stripe). Tensors whose stripe is empty send nothing for it (a tensor with
fewer rows than ranks, e.g. a scalar, lives on the first owners only). Payloads must have a
fixed size: variable-size codecs (dgc, qsgd with coding="elias") are rejected.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from ..codecs.base import Codec, Payload
from ..state.error_feedback import ErrorFeedback, encode_with_residual
from .bucket import Bucket, BucketOutcome, result_tensor
from .encoding import StepPositions, agree_scales
from .fusion import FusedLayout
from .stats import ExchangeStats, StepTotals
from .stripes import AXES, Stripe, matrix_shape, stripe_key, stripes

Entry = Tuple[str, Tuple[int, ...], torch.dtype]

#: ``axis="auto"`` uses column stripes only when they save at least this many bytes per stripe.
MIN_SAVING_PER_STRIPE = 8


def _stripes_bytes(codec: Codec, parts: Sequence[Stripe], dtype: torch.dtype) -> int:
    return sum(codec.payload_nbytes(st.shape, dtype) for st in parts if st.numel)


def choose_axis(codec: Codec, shape: Sequence[int], dtype: torch.dtype, k: int, axis: str = "auto") -> str:
    """The striping axis of one tensor: ``axis`` itself unless ``"auto"`` (see the module doc)."""
    if axis != "auto":
        if axis not in AXES:
            raise ValueError(f"two-phase exchange: axis must be 'auto', 'rows' or 'columns', got {axis!r}")
        return axis
    if len(shape) < 2 or k == 1 or matrix_shape(shape)[1] < k:
        return "rows"
    by_rows = _stripes_bytes(codec, stripes(shape, k, "rows"), dtype)
    by_cols = _stripes_bytes(codec, stripes(shape, k, "columns"), dtype)
    return "columns" if by_cols + MIN_SAVING_PER_STRIPE * k <= by_rows else "rows"


class StripePlan:
    """Everything about one step's exchange that depends only on the tensors, K and the codec.

    Fields:
        k: number of owners (ranks).
        entries: ``(name, shape, dtype)`` of every tensor, in exchange order.
        stripes: name -> its K :class:`~horovod_gradcomp.exchange.stripes.Stripe` (stripe s owned by rank s).
        layouts: ``layouts[s]`` fuses stripe s of every tensor whose stripe s is not empty
            (keys ``stripe_key(name, s)``, tensor order). It is the layout of what every rank
            sends owner s in phase 1 and of what owner s sends everyone in phase 2.
        where: stripe key -> (name, stripe).
    """

    def __init__(self, codec: Codec, entries: Sequence[Entry], k: int, axis: str = "auto"):
        self.k = k
        self.entries = [(n, tuple(int(d) for d in s), dt) for n, s, dt in entries]
        self.stripes: Dict[str, List[Stripe]] = {
            n: stripes(s, k, choose_axis(codec, s, dt, k, axis)) for n, s, dt in self.entries}
        self.where: Dict[str, Tuple[str, Stripe]] = {}
        self.layouts: List[FusedLayout] = []
        for owner in range(k):
            rows = []
            for n, _, dt in self.entries:
                st = self.stripes[n][owner]
                if st.numel:
                    key = stripe_key(n, owner)
                    self.where[key] = (n, st)
                    rows.append((key, torch.Size(st.shape), dt))
            self.layouts.append(FusedLayout(codec, rows))

    @property
    def payload_bytes_phase1(self) -> int:
        """Bytes one rank encodes in phase 1 (its K segments, its own included; padded)."""
        return sum(layout.nbytes for layout in self.layouts)

    def payload_bytes_phase2(self, rank: int) -> int:
        """Bytes of owner ``rank``'s requantized stripes (padded)."""
        return self.layouts[rank].nbytes

    def sent_bytes(self, rank: int) -> int:
        """Bytes rank ``rank`` sends: its phase-1 segments to the K-1 other owners, plus its
        phase-2 part to each of the K-1 others (what a direct allgatherv would send)."""
        phase1 = sum(layout.nbytes for j, layout in enumerate(self.layouts) if j != rank)
        return phase1 + (self.k - 1) * self.layouts[rank].nbytes


def _first(stacked: Payload) -> Payload:
    """Payload k=0 of a stacked payload (buffers ``[1, n]`` -> ``[n]``)."""
    return Payload({b: v[0] for b, v in stacked.buffers.items()}, stacked.shape, stacked.dtype, stacked.device)


class TwoPhasePattern:
    """The owner-of-1/K compressed exchange (see the module doc).

    Fields:
        codec: the fixed-size :class:`~horovod_gradcomp.codecs.base.Codec` used in both phases.
        axis: ``"auto"`` | ``"rows"`` | ``"columns"`` (see the module doc).
    The residuals live in the bucket's state (``memory``: full-size worker residuals;
    ``owner_memory``: the owned stripes'); this object keeps only a cache of plans.
    """

    name = "two_phase"

    def __init__(self, codec: Codec, *, axis: str = "auto"):
        if getattr(codec, "variable_size", False):
            raise ValueError(
                f"two-phase exchange: codec {codec.name!r} ({codec!r}) has variable-size payloads "
                "(variable_size=True); the owner exchange needs sizes known in advance. Use pattern='allgather' "
                "with this codec, or a fixed-size codec (e.g. qsgd with coding='fixed').")
        if axis != "auto" and axis not in AXES:
            raise ValueError(f"two-phase exchange: axis must be 'auto', 'rows' or 'columns', got {axis!r}")
        self.codec = codec
        self.axis = axis
        self._plans: Dict[tuple, StripePlan] = {}

    def plan(self, entries: Sequence[Entry], k: int) -> StripePlan:
        """The (cached) :class:`StripePlan` of these ``(name, shape, dtype)`` entries among k owners."""
        key = (tuple((n, tuple(s), dt) for n, s, dt in entries), k)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 32:  # parameter sets rarely change; do not grow without bound
                self._plans.clear()
            plan = self._plans[key] = StripePlan(self.codec, key[0], k, self.axis)
        return plan

    # -- the exchange -------------------------------------------------------------
    def exchange(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals) -> BucketOutcome:
        """Exchange ``bucket`` (every rank calls it with the same names, shapes, dtypes and step).

        Results: the mean over ranks, twice quantized, of each gradient's shape, dtype and device;
        bitwise equal on every rank. ``info``: ``k``, ``payload_bytes_phase1`` (this rank's K
        segments), ``payload_bytes_phase2`` (its owned stripes' requantized payloads),
        ``sent_bytes`` (phase 1 to the K-1 other owners plus its phase-2 part times K-1)."""
        memory = bucket.state.memory
        if not isinstance(memory, ErrorFeedback):
            raise ValueError(f"two-phase exchange works with error feedback only, got {memory!r}")
        k, rank, names, grads = comm.size, comm.rank, bucket.names, bucket.grads
        plan = self.plan([(n, tuple(grads[n].shape), grads[n].dtype) for n in names], k)
        positions = StepPositions(bucket.state.step, bucket.order, stripes=k, phases=2)

        # 1. worker side: compensate and encode every non-empty stripe
        segments = self._encode_stripes(comm, plan, bucket, positions, stats, totals)
        # 2. alltoallv: segment j (stripe j of every tensor) to owner j
        with stats.timed("exchange_s"):
            counts = [layout.nbytes for layout in plan.layouts]
            send = torch.empty(sum(counts), dtype=torch.uint8)
            offset = 0
            for layout, payloads, size in zip(plan.layouts, segments, counts):
                layout.pack(payloads, out=send[offset:offset + size])
                offset += size
            mine = plan.layouts[rank]
            recv = comm.alltoallv(send, counts, [mine.nbytes] * k) if k > 1 else send
        # 3. owner side: mean over ranks, owner residual, requantize
        devices = {key: grads[n].device for key, (n, _) in plan.where.items()}
        with stats.timed("decode_s"):
            means = [(key, self.codec.decode_mean_stacked(stacked))
                     for key, stacked in mine.unpack(recv.view(k, mine.nbytes), devices)]
        with stats.timed("encode_s"):
            owned = {key: self._requantize(bucket.state.owner_memory, plan, key, mean, positions)
                     for key, mean in means}
        # 4. allgatherv of the owners' payloads; decode every stripe into the results
        with stats.timed("exchange_s"):
            part = mine.pack(owned)
            parts = comm.allgatherv_known(part, counts) if k > 1 else [part]
        with stats.timed("decode_s"):
            results = {n: result_tensor(grads[n], bucket.outs.get(n)) for n in names}
            for layout, buf in zip(plan.layouts, parts):
                for key, stacked in layout.unpack(buf.view(1, layout.nbytes), devices):
                    n, st = plan.where[key]
                    if st.is_view:
                        self.codec.decode(_first(stacked), out=st.take(results[n]))
                    else:
                        st.put(results[n], self.codec.decode(_first(stacked)))
        info = {"k": k, "payload_bytes_phase1": plan.payload_bytes_phase1,
                "payload_bytes_phase2": plan.payload_bytes_phase2(rank), "sent_bytes": plan.sent_bytes(rank)}
        return BucketOutcome(results, plan.payload_bytes_phase1, plan.sent_bytes(rank), info)

    # -- the phases -----------------------------------------------------------------
    def _encode_stripes(self, comm, plan: StripePlan, bucket: Bucket, positions: StepPositions,
                        stats: ExchangeStats, totals: StepTotals) -> List[dict]:
        """Phase 1: ``segments[j][stripe_key(name, j)]`` = this rank's payload of stripe j of
        ``name`` (worker residual compensated and updated when error feedback is on; shared
        scales agreed in one MAX-allreduce)."""
        memory = bucket.state.memory
        with stats.timed("encode_s"):
            jobs = []  # (name, stripe, g_s, full residual, r_s)
            for n in bucket.names:
                g = bucket.grads[n].detach()
                r = memory.residual(n, g) if memory.enabled else None
                for st in plan.stripes[n]:
                    if st.numel:
                        jobs.append((n, st, st.take(g), r, None if r is None else st.take(r)))
        options = agree_scales(self.codec, comm, len(jobs),
                               lambda: [g_s if r_s is None else g_s + r_s for _, _, g_s, _, r_s in jobs],
                               stats, totals)
        with stats.timed("encode_s"):
            segments: List[Dict[str, Payload]] = [{} for _ in range(plan.k)]
            for (n, st, g_s, r, r_s), opts in zip(jobs, options):
                self.codec.reset_stream(positions(n, st.owner, 0))
                segments[st.owner][stripe_key(n, st.owner)] = encode_with_residual(self.codec, g_s, r_s, **opts)
                if r_s is not None and not st.is_view:
                    st.put(r, r_s)
        return segments

    def _requantize(self, owner_memory: ErrorFeedback, plan: StripePlan, key: str, mean: torch.Tensor,
                    positions: StepPositions) -> Payload:
        """Phase 3: the owner's payload of one stripe's mean (owner error feedback; a shared-scale
        codec uses the owner's own local scale: there is one sender, nothing to agree on)."""
        codec, (n, st) = self.codec, plan.where[key]
        codec.reset_stream(positions(n, st.owner, 1))
        opts = {}
        if getattr(codec, "shared_scale", False):
            opts["scale"] = codec.local_scale(owner_memory.compensated(key, mean))
        return owner_memory.encode(codec, key, mean, **opts)

    def __repr__(self) -> str:
        return f"TwoPhasePattern({self.codec!r}, axis={self.axis!r})"
