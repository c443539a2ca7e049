"""Two-phase compressed exchange: every rank owns 1/K of every tensor (Seide et al. 2014, 4.1).

One run of :meth:`TwoPhasePattern.steps` (a request sequence, :mod:`.requests`) on every rank (same tensors, same order):

1. Worker side. Each tensor is cut into K stripes (:mod:`horovod_gradcomp.exchange.stripes`; stripe s
   belongs to rank s). Rank k compensates stripe s with the matching part of its own residual
   (``state.memory.residual(name, grad)``: one full-size residual per tensor, as in the allgather
   pattern, so checkpoints and the error-feedback identity do not depend on K) and encodes it:
   ``v = g_s + r_s;  q = encode(v);  r_s <- v - decode(q)`` (the same
   :func:`~horovod_gradcomp.state.error_feedback.encode_with_residual` as whole tensors).
   Codecs with a ``shared_scale`` (TernGrad) encode stripe s with ``s = max over ranks of
   codec.local_scale(v)``: all stripes' scales in one MAX-allreduce
   (:func:`~horovod_gradcomp.exchange.scale_agreement.agree_scales`).
2. Alltoallv: rank k sends owner j the fused payloads of stripe j of every tensor (tensor
   order, one :class:`~horovod_gradcomp.exchange.fusion.FusedLayout` per owner; sizes come from the
   layouts, which every rank computes alike, so no size exchange).
3. Owner side: rank j decodes the mean over ranks of each stripe it owns
   (``codec.decode_mean_stacked`` of the K stacked payloads), adds its owner residual
   (``state.owner_memory``, keyed ``f"{name}[{j}]"``, enabled iff the worker feedback is) and
   encodes it again with the same codec (a shared-scale codec uses the owner's own
   ``local_scale``: there is one sender, nothing to agree on). A codec whose sum of K payloads
   has an exact compact form (``codec.owner_sum_codec(K)``; TernGrad: the shared scale times an
   integer in [-K, K], :mod:`horovod_gradcomp.codecs.ternary_sum`) sends that sum instead:
   no second quantization and no owner residual.
4. Allgatherv of the owners' payloads (sizes known); every rank decodes every stripe into
   its part of the result. Each gradient is thus quantized twice (once, with an exact owner
   sum); every rank gets bitwise the same result (all decode the same bytes).

Pipelined chunks (``chunk_bytes``, :mod:`horovod_gradcomp.exchange.pipeline`): each chunk goes
through the four phases with its own stripe plan; the shared scales of all chunks are agreed in
one allreduce first and every stripe keeps its stream position (S = K stripes, F = 2 phases,
:mod:`horovod_gradcomp.exchange.stream_positions`): the same bits as without chunks.

Striping axis (``axis``): ``"rows"`` cuts the 2-D view ``[shape[0], -1]`` by rows
(contiguous, no copies). A per-column codec (onebit: two float32 values per column) then
repeats every column's values in all K stripes, so its per-rank traffic would grow with K
(``16 * (K-1) * cols`` bytes per tensor in all), against the method's point. ``"auto"`` (the
default) therefore picks, per tensor and from the codec's layout alone (the same choice on
every rank), ``"columns"`` when the tensor is >= 2-D, has at least K columns and column
stripes save at least 8 bytes per stripe; ``"rows"`` otherwise. TernGrad and QSGD never save
that much (one scale per stripe, one partial bucket per stripe), so they stay on rows.
Column stripes are encoded and decoded in place where the codec has strided kernels for the
tensor (:meth:`~horovod_gradcomp.codecs.base.Codec.encodes_column_windows`: onebit's native CPU
kernels, its device kernels on CUDA and the twin; the same bytes as encoding a copy);
elsewhere (the reference impl) they cost a strided copy in and out. onebit's reconstruction values are then exactly per column of the
whole tensor, as in the paper (whose matrices are column-major).

Other choices: TernGrad's optional clipping and QSGD's buckets apply per stripe (buckets
restart at each stripe). Tensors whose stripe is empty send nothing for it (a tensor with
fewer rows than ranks, e.g. a scalar, lives on the first owners only). Payloads must have a
fixed size: variable-size codecs (dgc, qsgd with coding="elias") are rejected.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..codecs.base import Codec, Payload
from ..state.error_feedback import encode_with_residual
from ..state.memory import Memory
from .bucket import BoundedCache, Bucket, BucketOutcome, result_tensor
from .scale_agreement import agree_scales
from .stream_positions import StepPositions
from .fusion import FusedLayout
from .nonfinite_check import Unit, nonfinite_payloads, peek_residual
from .pipeline import ChunkPlanner
from .requests import Collective, Issue, Steps, Wait
from .staging import staging_for
from .stats import ExchangeStats, StepTotals
from .stripes import AXES, Stripe, matrix_shape, stripe_key, stripes

Entry = Tuple[str, Tuple[int, ...], torch.dtype]

#: ``axis="auto"`` uses column stripes only when they save at least this many bytes per stripe.
MIN_SAVING_PER_STRIPE = 8


def _stripes_bytes(codec: Codec, parts: Sequence[Stripe], dtype: torch.dtype) -> int:
    return sum(codec.payload_nbytes(st.shape, dtype) for st in parts if st.numel)


def choose_axis(codec: Codec, shape: Sequence[int], dtype: torch.dtype, k: int, axis: str = "auto") -> str:
    """The striping axis of one tensor: ``axis`` itself unless ``"auto"`` (see the module doc;
    :func:`~horovod_gradcomp.exchange.stripes.stripes` refuses any other)."""
    if axis != "auto":
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
            sends owner s in phase 1.
        owner_codec: what owners send in phase 2: the codec itself (the mean quantized again),
            or its exact-sum codec (:meth:`~horovod_gradcomp.codecs.base.Codec.owner_sum_codec`);
            ``exact_sum`` says which.
        owner_layouts: ``owner_layouts[s]``: what owner s sends everyone in phase 2 (the same
            stripes as ``layouts[s]``, in ``owner_codec``'s format).
        where: stripe key -> (name, stripe).
    """

    def __init__(self, codec: Codec, entries: Sequence[Entry], k: int, axis: str = "auto"):
        self.k = k
        self.owner_codec = codec.owner_sum_codec(k) or codec
        self.exact_sum = self.owner_codec is not codec
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
        self.owner_layouts = ([FusedLayout(self.owner_codec, layout.entries) for layout in self.layouts]
                              if self.exact_sum else self.layouts)

    @property
    def payload_bytes_phase1(self) -> int:
        """Bytes one rank encodes in phase 1 (its K segments, its own included; padded)."""
        return sum(layout.nbytes for layout in self.layouts)

    def payload_bytes_phase2(self, rank: int) -> int:
        """Bytes of owner ``rank``'s phase-2 payloads (padded)."""
        return self.owner_layouts[rank].nbytes

    def sent_bytes(self, rank: int) -> int:
        """Bytes rank ``rank`` sends: its phase-1 segments to the K-1 other owners, plus its
        phase-2 part to each of the K-1 others (what a direct allgatherv would send)."""
        phase1 = sum(layout.nbytes for j, layout in enumerate(self.layouts) if j != rank)
        return phase1 + (self.k - 1) * self.owner_layouts[rank].nbytes


class _StripeJob(NamedTuple):
    """One stripe to encode in phase 1: the tensor's ``name``, its ``stripe``, the whole gradient
    and residual (``residual`` None without error feedback), and the stripe's own copies or views
    of them (``grad_part`` None: the codec encodes the column window in place)."""
    name: str
    stripe: Stripe
    grad: torch.Tensor
    grad_part: Optional[torch.Tensor]
    residual: Optional[torch.Tensor]
    residual_part: Optional[torch.Tensor]


@dataclass
class _ChunkWork:
    """One chunk of a bucket on its way through the four phases (fields filled phase by phase)."""
    plan: StripePlan
    jobs: list
    options: list
    phase1: tuple = ()
    recv: Optional[torch.Tensor] = None
    phase3: tuple = ()
    parts: Optional[list] = None
    alltoallv: object = None
    allgatherv: object = None
    check_payloads: bool = False  # look for non-finite input in the owners' payloads (bucket.check_payloads)
    nonfinite: bool = False       # ... and found some


def _one_device(jobs: Sequence["_StripeJob"]) -> torch.device:
    """The device of every job's gradient when they share one, else the CPU (a bucket mixing
    devices stages through host memory)."""
    devices = {job.grad.device for job in jobs}
    return devices.pop() if len(devices) == 1 else torch.device("cpu")


def _first(stacked: Payload) -> Payload:
    """Payload k=0 of a stacked payload (buffers ``[1, n]`` -> ``[n]``)."""
    return Payload({b: v[0] for b, v in stacked.buffers.items()}, stacked.shape, stacked.dtype, stacked.device)


class TwoPhasePattern:
    """The owner-of-1/K compressed exchange (see the module doc).

    Fields:
        codec: the fixed-size :class:`~horovod_gradcomp.codecs.base.Codec` used in both phases.
        axis: ``"auto"`` | ``"rows"`` | ``"columns"`` (see the module doc).
        chunker: the pipelined chunks of a bucket (:class:`~horovod_gradcomp.exchange.pipeline.ChunkPlanner`;
            ``chunk_bytes`` None: the whole bucket at once).
    :meth:`steps` is the exchange (a request sequence).
    The residuals live in the bucket's state (``memory``: full-size worker residuals;
    ``owner_memory``: the owned stripes'); this object keeps only a cache of plans.
    """

    name = "two_phase"

    def __init__(self, codec: Codec, *, axis: str = "auto", chunk_bytes: Optional[int] = None):
        if codec.variable_size:
            raise ValueError(
                f"two-phase exchange: codec {codec.name!r} ({codec!r}) has variable-size payloads "
                "(variable_size=True); the owner exchange needs sizes known in advance. Use pattern='allgather' "
                "with this codec, or a fixed-size codec (e.g. qsgd with coding='fixed').")
        if axis != "auto" and axis not in AXES:
            raise ValueError(f"two-phase exchange: axis must be 'auto', 'rows' or 'columns', got {axis!r}")
        self.codec = codec
        self.axis = axis
        self.chunker = ChunkPlanner(codec, chunk_bytes)
        self._plans = BoundedCache(256)

    def memory_keys(self, names: Sequence[str], rank: int) -> Tuple[List[str], List[str]]:
        """(worker, owner) memory keys a bucket may change (:mod:`.patterns`): the tensors' own, and
        the stripes this rank owns (``stripe_key(name, rank)``)."""
        return list(names), [stripe_key(n, rank) for n in names]

    def plan(self, entries: Sequence[Entry], k: int) -> StripePlan:
        """The (cached) :class:`StripePlan` of these ``(name, shape, dtype)`` entries among k owners."""
        key = (tuple((n, tuple(s), dt) for n, s, dt in entries), k)
        return self._plans.get_or_make(key, lambda: StripePlan(self.codec, key[0], k, self.axis))

    # -- the exchange -------------------------------------------------------------
    def steps(self, comm, bucket: Bucket, stats: ExchangeStats, totals: StepTotals, overlap: bool = False) -> Steps:
        """Exchange ``bucket``, as a request sequence (:mod:`.requests`; every rank runs it with
        the same names, shapes, dtypes and step).

        Results: the mean over ranks, twice quantized, of each gradient's shape, dtype and device;
        bitwise equal on every rank. ``info``: ``k``, ``chunks`` and the :class:`StripePlan` s'
        byte counts summed over the chunks (``payload_bytes_phase1``, ``payload_bytes_phase2``,
        ``sent_bytes``). With ``chunk_bytes`` and ``overlap`` (the driver can keep collectives in
        flight) the chunks are pipelined (:meth:`_chunk_steps`)."""
        memory = bucket.state.memory
        if not memory.supports_owner_stripes:
            raise ValueError(f"two-phase exchange works with error feedback only, got {memory!r}")
        k, rank, names, grads = comm.size, comm.rank, bucket.names, bucket.grads
        entries = [(n, tuple(grads[n].shape), grads[n].dtype) for n in names]
        chunks = self.chunker.chunks(entries, k)
        pipelined = chunks is not None and overlap
        plans = [self.plan(chunk, k) for chunk in chunks] if pipelined else [self.plan(entries, k)]
        positions = StepPositions(bucket.state.step, bucket.order, stripes=k, phases=2)
        with stats.timed("encode_s"):
            jobs = [self._jobs(plan, grads, lambda n, g: memory.residual(n, g) if memory.enabled else None)
                    for plan in plans]
        flat = [job for chunk_jobs in jobs for job in chunk_jobs]
        options = iter((yield from agree_scales(   # the stripes' shared scales in one collective
            self.codec, comm, [stripe_key(j.name, j.stripe.owner) for j in flat],
            lambda: [j.grad_part if j.residual_part is None else j.grad_part + j.residual_part for j in flat],
            stats, totals, bucket.measured)))
        chunk_options = [[next(options) for _ in chunk_jobs] for chunk_jobs in jobs]
        results = {n: result_tensor(grads[n], bucket.outs.get(n)) for n in names}
        devices = {n: grads[n].device for n in names}
        work = [_ChunkWork(plan, chunk_jobs, opts, check_payloads=bucket.check_payloads)
                for plan, chunk_jobs, opts in zip(plans, jobs, chunk_options)]
        if pipelined:
            yield from self._chunk_steps(comm, work, bucket, positions, devices, results, stats)
        else:
            w = work[0]
            w.phase1 = self._phase1(comm, w, positions, stats)
            w.recv = (yield Collective("alltoallv", w.phase1, comm)) if k > 1 else w.phase1[0]
            w.phase3 = self._phase3(comm, w, bucket, positions, devices, stats)
            w.parts = [w.phase3[0]]
            if k > 1:
                w.parts = yield Collective("allgatherv_known", w.phase3, comm, "owners", last=True)
            self._phase4(w, devices, results, stats)
        phase1 = sum(p.payload_bytes_phase1 for p in plans)
        phase2 = sum(p.payload_bytes_phase2(rank) for p in plans)
        sent = sum(p.sent_bytes(rank) for p in plans)
        info = {"k": k, "payload_bytes_phase1": phase1, "payload_bytes_phase2": phase2, "sent_bytes": sent,
                "chunks": len(plans)}
        return BucketOutcome(results, phase1, sent, info, nonfinite=any(w.nonfinite for w in work))

    def units(self, memory: Memory, names: Sequence[str], grads, k: int) -> List[Unit]:
        """The stripe encodes of a bucket, as :mod:`horovod_gradcomp.exchange.nonfinite_check` reads them
        before the preamble (keys ``stripe_key(name, owner)``, the order of :meth:`_jobs`): column
        windows encoded in place name their window of the whole tensor. Residuals are read, never created."""
        plan = self.plan([(n, tuple(grads[n].shape), grads[n].dtype) for n in names], k)
        return [Unit(stripe_key(j.name, j.stripe.owner), j.grad, j.residual, (j.name, j.stripe.start, j.stripe.stop))
                if j.grad_part is None else Unit(stripe_key(j.name, j.stripe.owner), j.grad_part, j.residual_part)
                for j in self._jobs(plan, grads, lambda n, g: peek_residual(memory, n, g))]

    def _jobs(self, plan: StripePlan, grads, residual_of) -> List["_StripeJob"]:
        """A :class:`_StripeJob` for every non-empty stripe of the plan's tensors, in tensor then owner
        order (``residual_of(name, gradient)``: its residual or None). A column window the codec
        encodes in place (:meth:`~horovod_gradcomp.codecs.base.Codec.encodes_column_windows`; not
        with a shared scale, which reads the stripe's values) takes no copies; other stripes are
        taken (a view for row stripes, a copy for columns)."""
        jobs = []
        for n, _, _ in plan.entries:
            g = grads[n].detach()
            r = residual_of(n, g)
            for st in plan.stripes[n]:
                if not st.numel:
                    continue
                if not self.codec.shared_scale and not st.is_view and self.codec.encodes_column_windows(
                        g, st.stop - st.start):
                    jobs.append(_StripeJob(n, st, g, None, r, None))
                else:
                    jobs.append(_StripeJob(n, st, g, st.take(g), r, None if r is None else st.take(r)))
        return jobs

    def _chunk_steps(self, comm, work: List["_ChunkWork"], bucket: Bucket, positions: StepPositions,
                     devices, results, stats: ExchangeStats) -> Steps:
        """The chunks' phases in a fixed schedule: encode chunk c, then the owner step of chunk
        c-1, then the decode of chunk c-2; each chunk's two collectives are issued, in an order
        that is the same on every rank, and waited for only when their result is needed."""
        def owner_step(w):
            w.recv = yield Wait(w.alltoallv)
            w.phase3 = self._phase3(comm, w, bucket, positions, devices, stats)
            w.allgatherv = yield Issue(Collective("allgatherv_known", w.phase3, comm, "owners", last=w is work[-1]))

        def finish(w):
            w.parts = yield Wait(w.allgatherv)
            self._phase4(w, devices, results, stats)

        for c, w in enumerate(work):
            w.phase1 = self._phase1(comm, w, positions, stats)
            w.alltoallv = yield Issue(Collective("alltoallv", w.phase1, comm))
            if c >= 1:
                yield from owner_step(work[c - 1])
            if c >= 2:
                yield from finish(work[c - 2])
        yield from owner_step(work[-1])
        for w in work[-2:]:
            yield from finish(w)

    # -- the phases -----------------------------------------------------------------
    def _phase1(self, comm, w: "_ChunkWork", positions: StepPositions, stats: ExchangeStats):
        """Worker side: every stripe compensated and encoded (worker residual updated), packed
        for the alltoallv: ``(send, send counts, receive counts)``."""
        plan = w.plan
        with stats.timed("encode_s"):
            segments: List[Dict[str, Payload]] = [{} for _ in range(plan.k)]
            for job, payload in zip(w.jobs, self._encode_jobs(w, positions)):
                segments[job.stripe.owner][stripe_key(job.name, job.stripe.owner)] = payload
        with stats.timed("exchange_s"):
            counts = [layout.nbytes for layout in plan.layouts]
            send = staging_for(_one_device(w.jobs), comm).empty(sum(counts))  # host, or the device (direct path)
            offset = 0
            for layout, payloads, size in zip(plan.layouts, segments, counts):
                layout.pack(payloads, out=send[offset:offset + size])
                offset += size
        return send, counts, [plan.layouts[comm.rank].nbytes] * plan.k

    def _encode_jobs(self, w: "_ChunkWork", positions: StepPositions) -> List[Payload]:
        """Every stripe job's payload, in job order, worker residuals updated: the column windows
        encoded in place in one codec call, the stripes' views and copies in another (each one
        bucket op where the codec has it; a non-fused codec with a residual goes stripe by stripe)."""
        codec, jobs = self.codec, w.jobs
        position = [positions(job.name, job.stripe.owner, 0) for job in jobs]
        payloads: List[Optional[Payload]] = [None] * len(jobs)
        windows = [i for i, job in enumerate(jobs) if job.grad_part is None]
        scales = [w.options[i].get("scales") for i in windows]
        encoded = codec.encode_columns_many([(jobs[i].grad, jobs[i].residual, jobs[i].stripe.start, jobs[i].stripe.stop)
                                            for i in windows], [position[i] for i in windows],
                                            scales=scales if scales and scales[0] is not None else None)
        for i, payload in zip(windows, encoded):
            payloads[i] = payload
        parts = [i for i, job in enumerate(jobs) if job.grad_part is not None]
        with_residual = [jobs[i].residual_part is not None for i in parts]
        if not any(with_residual) or (codec.fuses_feedback and all(with_residual)):
            encoded = codec.encode_many([jobs[i].grad_part for i in parts],
                                        [jobs[i].residual_part for i in parts] if any(with_residual) else None,
                                        [w.options[i] for i in parts], [position[i] for i in parts])
        else:
            encoded = []
            for i in parts:
                codec.reset_stream(position[i])
                encoded.append(encode_with_residual(codec, jobs[i].grad_part, jobs[i].residual_part, **w.options[i]))
        for i, payload in zip(parts, encoded):
            payloads[i] = payload
            job = jobs[i]
            if job.residual_part is not None and not job.stripe.is_view:
                job.stripe.put(job.residual, job.residual_part)
        return payloads

    def _phase3(self, comm, w: "_ChunkWork", bucket: Bucket, positions: StepPositions, devices,
                stats: ExchangeStats):
        """Owner side: the mean over ranks of each owned stripe, owner residual, requantized and
        packed for the allgatherv: ``(part, counts)``."""
        plan, k = w.plan, w.plan.k
        mine = plan.layouts[comm.rank]
        stripe_devices = {key: devices[n] for key, (n, _) in plan.where.items()}
        received = mine.unpack(w.recv.view(k, mine.nbytes), stripe_devices)
        poison = False
        if bucket.check_payloads:  # a non-finite input shows in what the owner sends on (NaN means)
            received = list(received)
            poison = nonfinite_payloads(self.codec, [stacked for _, stacked in received])
        if plan.exact_sum:
            with stats.timed("encode_s"):
                owned = {key: plan.owner_codec.encode_stacked(self.codec, stacked) for key, stacked in received}
        else:
            keys = [key for key, _ in received]
            with stats.timed("decode_s"):
                means = self.codec.decode_mean_stacked_many([stacked for _, stacked in received])
                if poison:
                    for mean in means:
                        mean.fill_(float("nan"))
            with stats.timed("encode_s"):
                owned = dict(zip(keys, self._requantize(bucket.state.owner_memory, plan, keys, means, positions)))
        with stats.timed("exchange_s"):
            part = plan.owner_layouts[comm.rank].pack(owned, comm=comm)
        return part, [layout.nbytes for layout in plan.owner_layouts]

    def _phase4(self, w: "_ChunkWork", devices, results, stats: ExchangeStats) -> None:
        """Every owner's requantized stripes decoded into their place in the results."""
        plan = w.plan
        codec = plan.owner_codec
        stripe_devices = {key: devices[n] for key, (n, _) in plan.where.items()}
        with stats.timed("decode_s"):
            views, windows, copies = [], [], []
            for layout, buf in zip(plan.owner_layouts, w.parts):
                for key, stacked in layout.unpack(buf.view(1, layout.nbytes), stripe_devices):
                    if w.check_payloads and not w.nonfinite:
                        w.nonfinite = nonfinite_payloads(codec, [stacked])
                    n, st = plan.where[key]
                    if st.is_view:
                        views.append((_first(stacked), st.take(results[n])))
                    elif codec.encodes_column_windows(results[n], st.stop - st.start):
                        windows.append((_first(stacked), results[n], st.start))
                    else:
                        copies.append((_first(stacked), st, results[n]))
            codec.decode_many([payload for payload, _ in views], outs=[out for _, out in views])
            codec.decode_columns_many(windows)
            for payload, st, result in copies:
                st.put(result, codec.decode(payload))

    def _requantize(self, owner_memory: Memory, plan: StripePlan, keys: Sequence[str],
                    means: Sequence[torch.Tensor], positions: StepPositions) -> List[Payload]:
        """Phase 3: the owner's payloads of its stripes' means (owner error feedback; a shared-scale
        codec uses the owner's own local scale: there is one sender, nothing to agree on)."""
        codec = self.codec
        opts = [{} for _ in keys]
        if codec.shared_scale:
            scales = codec.local_scales_many([owner_memory.compensated(key, mean) for key, mean in zip(keys, means)])
            opts = [{"scale": scale} for scale in scales]
        position = [positions(plan.where[key][0], plan.where[key][1].owner, 1) for key in keys]
        return owner_memory.encode_many(codec, keys, means, opts, position)

    def __repr__(self) -> str:
        return f"TwoPhasePattern({self.codec!r}, axis={self.axis!r})"
