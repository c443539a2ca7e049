"""One DDP bucket's compressed exchange as a chain of asynchronous collectives.

Each pattern is written here as a generator that yields :class:`Call` s (one asynchronous
collective of :class:`~horovod_gradcomp.transports.torch_dist.TorchDistributedCommunicator`)
and is resumed with each collective's result; between the yields it runs the same building
blocks as the synchronous patterns (:class:`~horovod_gradcomp.exchange.allgather.AllgatherPattern`,
:class:`~horovod_gradcomp.exchange.two_phase.TwoPhasePattern`: encode through the memory from
the same stream positions, fused layouts, owner requantization, decode), so its results,
residuals and counts are those of :meth:`StepEngine.exchange` with the same partition:

* preamble: one allgather of the engine's agreement digest and non-finite flag
  (:func:`~horovod_gradcomp.exchange.preamble.bucket_preamble`; the flag from
  :meth:`StepEngine.bucket_job`'s check, :mod:`horovod_gradcomp.exchange.measure`, whose
  measured scales the encodes below reuse; QSGD's received norms may still flag the step);
* allgather pattern: [shared scales: MAX-allreduce] -> encode -> allgather of the fused
  payloads (variable size: allgather of the sizes, then of the parts padded to the largest)
  -> decode of the mean;
* two-phase pattern: stripes -> [shared scales] -> worker encode -> alltoallv -> owner
  requantization -> allgather of the owners' parts (padded to the largest) -> decode;
* hierarchical pattern (:mod:`horovod_gradcomp.exchange.hierarchical`): alltoallv of the
  stripes inside the node -> node means -> the inner pattern's job above among the peers (its
  collectives on the peers' group, none of them ``last``) -> allgather of the decoded shards
  inside the node;
* dense pattern (a codec's ``warmup_steps``, :mod:`horovod_gradcomp.exchange.dense_warmup`):
  alltoallv of the flat fp32 slices -> the owner's sum -> allgather of the mean's slices.

The last :class:`Call` of a job is marked ``last``: once it is issued, the sequencer
(:mod:`horovod_gradcomp.ddp.hook`) lets the next bucket issue its collectives, while this one's
bytes are still on the wire.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, List

import torch

from ..exchange.allgather import AllgatherPattern
from ..exchange.dense_warmup import DensePattern
from ..exchange.bucket import Bucket, BucketOutcome, result_tensor
from ..exchange.scale_agreement import measured_or_local_scales, with_measured
from ..exchange.stream_positions import StepPositions
from ..exchange.engine import BucketJob, StepEngine
from ..exchange.fusion import pack_variable, unpack_variable
from ..exchange.hierarchical import HierarchicalPattern
from ..exchange.preamble import bucket_preamble
from ..exchange.stats import allgather_wire_bytes, allreduce_wire_bytes
from ..exchange.stripes import stripe_key
from ..exchange.two_phase import TwoPhasePattern, _ChunkWork


@dataclass
class Call:
    """One asynchronous collective: ``fn(*args)`` returns a ``torch.futures.Future``; ``kind``
    names it in timelines; ``last``: the job's final collective."""
    fn: Callable
    args: tuple
    kind: str
    last: bool = False


Job = Generator[Call, object, None]


class _Captured(Exception):
    """Raised by :class:`_Replay` to stop :func:`bucket_preamble` once its bytes are known."""


@dataclass
class _Replay:
    """A stand-in communicator for :func:`bucket_preamble` (the one implementation of the
    preamble's bytes and of their check): without ``received`` it captures the bytes this rank
    would send; with them it answers the allgather with what the ranks sent."""
    size: int
    received: object = None
    sent: List[torch.Tensor] = field(default_factory=list)

    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        if self.received is None:
            self.sent.append(send.clone())
            raise _Captured()
        return self.received


def _preamble(engine: StepEngine, comm, job: BucketJob) -> Generator[Call, object, bool]:
    """The bucket's preamble collective; returns whether any rank flagged a non-finite gradient
    (raises ExchangeMismatchError on every rank when the ranks disagree)."""
    check = engine.check_agreement
    if comm.size == 1:
        return job.local_nonfinite
    capture = _Replay(comm.size)
    try:
        bucket_preamble(capture, engine.owner, job.signature, job.local_nonfinite, check)
    except _Captured:
        pass
    every = yield Call(comm.allgather_async, (capture.sent[0],), "preamble")
    return bucket_preamble(_Replay(comm.size, every.cpu()), engine.owner, job.signature, job.local_nonfinite, check)


def _agree_scales(codec, comm, values: Callable[[], List[torch.Tensor]], count: int, stats, totals,
                  local=None) -> Generator[Call, object, List[dict]]:
    """The asynchronous :func:`~horovod_gradcomp.exchange.encoding.agree_scales`: encode options
    of ``count`` tensors (shared scale = max over ranks of ``local_scale``, one MAX-allreduce;
    ``local``: the local scales measured before the preamble, or None)."""
    if not getattr(codec, "shared_scale", False) or count == 0:
        return [{} for _ in range(count)]
    local = measured_or_local_scales(codec, count, values, stats, local)
    if comm.size > 1:
        local = yield Call(comm.allreduce_max_async, (local,), "scales")
        totals.add(sent=allreduce_wire_bytes(8 * local.size, comm.size))
    return [{"scale": float(s)} for s in local]


def _allgather(pattern: AllgatherPattern, comm, bucket: Bucket, stats, totals
               ) -> Generator[Call, object, BucketOutcome]:
    """The allgather pattern (see :meth:`AllgatherPattern.exchange`, whole bucket, no chunks)."""
    codec, names, memory, measured = pattern.codec, bucket.names, bucket.state.memory, bucket.measured
    options = yield from _agree_scales(codec, comm, lambda: [memory.compensated(n, bucket.grads[n]) for n in names],
                                       len(names), stats, totals,
                                       measured.local_for(names) if measured is not None else None)
    options = with_measured(options, names, measured)
    pending = pattern.encode_names(bucket, names, dict(zip(names, options)), stats)
    results = {}
    if getattr(codec, "variable_size", False):
        with stats.timed("exchange_s"):
            send = pack_variable(names, pending)
        sizes = yield Call(comm.sizes_async, (send.numel(),), "sizes")
        parts = yield Call(comm.allgatherv_known_async, (send, sizes), "payload", last=True)
        with stats.timed("decode_s"):
            decoded = [unpack_variable(part, names, pending) for part in parts]
            nonfinite = pattern.decode_lists(decoded, bucket, results)
        payload, extra = send.numel(), 8
    else:
        layout = pattern.layout(names, pending)
        with stats.timed("exchange_s"):
            send = layout.pack(pending)
        recv = yield Call(comm.allgather_async, (send,), "payload", last=True)
        with stats.timed("decode_s"):
            nonfinite = pattern.decode_stacked(layout.unpack(recv, {n: pending[n].device for n in names}), bucket,
                                               results)
        payload, extra = layout.nbytes, 0
    return BucketOutcome(results, payload, allgather_wire_bytes(payload + extra, comm.size), nonfinite=nonfinite)


def _two_phase(pattern: TwoPhasePattern, comm, bucket: Bucket, stats, totals
               ) -> Generator[Call, object, BucketOutcome]:
    """The two-phase pattern (see :meth:`TwoPhasePattern.exchange`, whole bucket, no chunks)."""
    k, rank, names, grads = comm.size, comm.rank, bucket.names, bucket.grads
    plan = pattern.plan([(n, tuple(grads[n].shape), grads[n].dtype) for n in names], k)
    positions = StepPositions(bucket.state.step, bucket.order, stripes=k, phases=2)
    jobs = pattern._stripe_jobs(plan, bucket, stats)
    measured, keys = bucket.measured, [stripe_key(j.name, j.stripe.owner) for j in jobs]
    options = yield from _agree_scales(
        pattern.codec, comm,
        lambda: [j.grad_part if j.residual_part is None else j.grad_part + j.residual_part for j in jobs],
        len(jobs), stats, totals, measured.local_for(keys) if measured is not None else None)
    options = with_measured(options, keys, measured)
    results = {n: result_tensor(grads[n], bucket.outs.get(n)) for n in names}
    devices = {n: grads[n].device for n in names}
    work = _ChunkWork(plan, jobs, options, check_payloads=bucket.check_payloads)
    work.phase1 = pattern._phase1(comm, work, positions, stats)
    work.recv = yield Call(comm.alltoallv_async, work.phase1, "alltoallv")
    work.phase3 = pattern._phase3(comm, work, bucket, positions, devices, stats)
    work.parts = yield Call(comm.allgatherv_known_async, work.phase3, "owners", last=True)
    pattern._phase4(work, devices, results, stats)
    info = {"k": k, "payload_bytes_phase1": plan.payload_bytes_phase1,
            "payload_bytes_phase2": plan.payload_bytes_phase2(rank), "sent_bytes": plan.sent_bytes(rank), "chunks": 1}
    return BucketOutcome(results, plan.payload_bytes_phase1, plan.sent_bytes(rank), info, nonfinite=work.nonfinite)


def _dense(pattern: DensePattern, comm, bucket: Bucket, stats, totals) -> Generator[Call, object, BucketOutcome]:
    """The dense pattern (see :meth:`DensePattern.exchange`): its three steps around the two collectives."""
    flat, send, send_counts, recv_counts = pattern.prepare(comm, bucket, stats)
    if comm.size == 1:
        return pattern.finish(comm, bucket, flat, [send], stats)
    recv = yield Call(comm.alltoallv_async, (send, send_counts, recv_counts), "alltoallv")
    part, counts = pattern.reduce(comm, flat, recv, stats)
    gathered = yield Call(comm.allgatherv_known_async, (part, counts), "owners", last=True)
    return pattern.finish(comm, bucket, flat, gathered, stats)


def _hierarchical(pattern: HierarchicalPattern, comm, bucket: Bucket, stats, totals
                  ) -> Generator[Call, object, BucketOutcome]:
    """The hierarchical pattern (see :meth:`HierarchicalPattern.exchange`): the node steps
    around the inner pattern's job, whose calls are passed on with ``last`` cleared."""
    node = pattern.node
    work = pattern.scatter(bucket, stats)
    recv = work.send
    if node.size > 1:
        recv = yield Call(node.alltoallv_async, (work.send, work.send_counts, work.recv_counts), "node_scatter")
    inner = pattern.node_means(work, recv, bucket, stats)
    work.outcome = BucketOutcome({}, 0, 0.0)
    if inner.names:
        flat = pattern.inner_pattern(inner)
        job = _PATTERNS[flat.name](flat, pattern.peers, inner, stats, totals)
        try:
            call = next(job)
            while True:
                call.last = False   # the node gather still follows
                call = job.send((yield call))
        except StopIteration as stop:
            work.outcome = stop.value
    part, counts = pattern.gather_args(work, bucket, stats)
    gathered = [part]
    if node.size > 1:
        gathered = yield Call(node.allgatherv_known_async, (part, counts), "node_gather", last=True)
    return pattern.finish(work, gathered, bucket, stats)


_PATTERNS = {"allgather": _allgather, "two_phase": _two_phase, "dense": _dense, "hierarchical": _hierarchical}


def bucket_job(engine: StepEngine, comm, job: BucketJob, snapshot: bool) -> Job:
    """The whole bucket: preamble, then its pattern; the results go to the engine
    (:meth:`StepEngine.close_bucket`), written into the bucket's gradient views."""
    nonfinite = yield from _preamble(engine, comm, job)
    bucket = engine.open_bucket(job, nonfinite, snapshot)
    if bucket is None:
        return
    outcome = yield from _PATTERNS[job.pattern](engine._patterns[job.pattern], comm, bucket, engine.stats,
                                                 engine._totals)
    engine.close_bucket(job, outcome)


__all__ = ["Call", "Job", "bucket_job"]
