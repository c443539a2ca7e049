"""The step engine: one step's gradients in, bucket by bucket, each through its pattern.

A step: gradients arrive one by one (:meth:`StepEngine.submit`, from Horovod's hooks) or all
at once (:meth:`StepEngine.exchange`). They are exchanged in buckets, in an order every rank
shares (never hook order):

* without ``bucket_bytes``, all of the step's gradients form one bucket, exchanged at the
  flush (:meth:`StepEngine.finish`);
* with ``bucket_bytes``, from the second step on (the plan is built from the first step's
  names, :mod:`horovod_gradcomp.exchange.bucket_plan`) and with ``overlap``, a communication
  thread exchanges bucket j as soon as its gradients are all in, while backward goes on;
* with an explicit ``partition`` (:meth:`StepEngine.exchange`), bucket j is ``partition[j]``:
  the partition a caller such as PyTorch DDP chose. The DDP hook runs the same bucket sequence
  through its own driver, so a step through either path with the same partition gives the same
  stream positions, residuals and results.

One bucket: :meth:`StepEngine.bucket_job` (pattern, non-finite check), then
:meth:`StepEngine.bucket_steps`, its request sequence, which the engine's
:class:`~.blocking_driver.BlockingDriver` runs under the stall watchdog (the layers it crosses:
docs/architecture.md). The step closes with one ``stats`` record and ``state.end_step()``.

Non-finite gradients: when any rank has a NaN or Inf in a bucket, no rank encodes that bucket
(its memory is untouched) and every result of the step is NaN on every rank, so every rank
skips the same step (``torch.amp.GradScaler``'s rule). Buckets that left earlier in the step
are rolled back to the memory they had before it (the engine snapshots a bucket's memory before
encoding it whenever a step has several buckets).

``pattern="auto"`` picks per bucket, identically on every rank: :meth:`StepEngine.flat_auto`
(the rule in words: docs/guide/exchange.md), or ``hierarchical`` on a multi-level layout, looked
for at the first bucket only where one is given or the launcher hints at it
(:meth:`StepEngine.connect_layout`).
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import torch

from ..codecs.base import Codec
from ..flags import require_flag
from ..state.compression_state import CompressionState
from ..transports.interface import ThreadLevelCommunicator
from .blocking_driver import BlockingDriver
from .bucket import Bucket, BucketOutcome
from .bucket_plan import BucketPlan
from .nonfinite_check import Measured, measure_bucket
from .patterns import CHOOSABLE, build_patterns
from .preamble import PREAMBLE_BYTES, preamble_steps
from .requests import Steps
from .stats import ExchangeStats, StepTotals, allgather_wire_bytes
from .step_ramp import apply_ramp, ramp_factor
from .stream_handoff import HandoffMark, StreamHandoff
from .pipeline import DEFAULT_CHUNK_BYTES, wire_poll_s
from .topology import can_split, discover_layout, launcher_hint, ranks_per_node_setting, require_equal, sub_communicators
from .watchdog import default_watchdog, resolve_timeout

#: ``pattern="auto"`` keeps the single allgather below this many bytes sent per rank.
AUTO_MIN_BYTES = 1 << 16
_warned_thread_level = False


@dataclass
class BucketJob:
    """One bucket about to be exchanged (:meth:`StepEngine.bucket_job`).

    Fields: names (exchange order), grads (name -> this rank's gradient), tag (the bucket's
    label in the agreement check and messages), pattern (chosen identically on every rank),
    signature (what the preamble's digest covers), k, rank, what (the stall watchdog's
    description of the wait), measured (the check's
    :class:`~horovod_gradcomp.exchange.nonfinite_check.Measured`: this rank's non-finite flag and
    what the encode reuses)."""
    names: List[str]
    grads: Dict[str, torch.Tensor]
    tag: str
    pattern: str
    signature: List[str]
    k: int
    rank: int
    what: str
    measured: Measured


class StepEngine:
    """Runs each step's exchange for one compression object (see the module doc).

    Fields:
        codec, state: the codec and this rank's :class:`~horovod_gradcomp.state.CompressionState`.
        registration: name -> position in ``named_parameters`` and ``sizes``: name -> gradient
            bytes (the bucket plan's order and sizes).
        order: name -> index among the sorted names: the exchange order and stream positions.
        pattern, bucket_bytes, overlap, check_agreement, pipeline_bytes: the options (see the
            factories; ``pipeline_bytes`` None: no pipelined chunks).
        timeout: seconds a bucket may wait before the job is aborted (0: no deadline).
        communicator: a callable returning the communicator (resolved at each bucket, so that
            the default one is created only when first needed).
        stats: this rank's :class:`~horovod_gradcomp.exchange.stats.ExchangeStats`.
        plan: the current :class:`~horovod_gradcomp.exchange.bucket_plan.BucketPlan` (None: one bucket).
        handoff: the :class:`~horovod_gradcomp.exchange.stream_handoff.StreamHandoff` of gradients
            and results between threads (see the module doc).
    The pending gradients, the results and the thread belong to the engine alone (under its lock).
    """

    def __init__(self, codec: Codec, state: CompressionState, registration: Sequence[str], sizes: Mapping[str, int],
                 *, owner: str, communicator: Callable[[], object], pattern: Optional[str] = None,
                 bucket_bytes: Optional[int] = None, overlap: bool = True, check_agreement: bool = True,
                 timeout: Optional[float] = None, pipeline_bytes: Optional[int] = DEFAULT_CHUNK_BYTES,
                 ranks_per_node: Optional[int] = None, inner_pattern: str = "auto"):
        if pattern is None:
            pattern = codec.default_pattern
        if pattern not in CHOOSABLE:
            raise ValueError(f"{owner}: pattern must be one of {CHOOSABLE}, got {pattern!r}")
        if pattern == "two_phase" and codec.variable_size:
            raise ValueError(f"{owner}: pattern='two_phase' needs fixed-size payloads, but {codec!r} has "
                             "variable-size payloads; use pattern='allgather' (or 'auto')")
        if pattern == "two_phase" and not state.memory.supports_owner_stripes:
            raise ValueError(f"{owner}: pattern='two_phase' works with error feedback only")
        if pattern == "hierarchical" and state.memory.clip_norm is not None:
            raise ValueError(f"{owner}: pattern='hierarchical' does not take DGC's clip_norm (its clipping coefficient "
                             "comes from one rank's whole gradient, while the hierarchical exchange encodes node "
                             "means); clip before the exchange, or use a flat pattern")
        self.ranks_per_node = ranks_per_node_setting(ranks_per_node, owner)  # a bad value fails here, on every rank
        self._ranks_per_node_option = ranks_per_node
        if bucket_bytes is not None:
            BucketPlan([], {}, bucket_bytes)  # validates
        if pipeline_bytes is not None and (isinstance(pipeline_bytes, bool) or not isinstance(pipeline_bytes, int)
                                           or pipeline_bytes < 0):
            raise ValueError(f"{owner}: pipeline_bytes must be a non-negative int or None, got {pipeline_bytes!r}")
        self.codec, self.state, self.owner = codec, state, owner
        self.registration = {n: i for i, n in enumerate(registration)}
        self.sizes = dict(sizes)
        self.order = {n: i for i, n in enumerate(sorted(self.registration))}
        self.pattern, self.bucket_bytes = pattern, bucket_bytes
        self.overlap = require_flag("exchange", "overlap", overlap)
        self.check_agreement = require_flag("exchange", "check_agreement", check_agreement)
        self.pipeline_bytes = pipeline_bytes or None
        wire_poll_s()  # a bad HOROVOD_GRADCOMP_WIRE_POLL_S fails here, on every rank, before any step
        self.communicator = communicator
        self.timeout = resolve_timeout(timeout)
        self.watchdog = default_watchdog()
        self.stats = ExchangeStats()
        self.plan: Optional[BucketPlan] = None
        #: name -> this engine's pattern object (:mod:`.patterns`)
        self.patterns = build_patterns(codec, state.memory, self.pipeline_bytes, inner_pattern, self.flat_auto)
        #: runs each bucket's request sequence on the calling thread (:mod:`.blocking_driver`)
        self.driver = BlockingDriver(self.stats, _threads_allowed)
        #: The node layout in use by the hierarchical pattern (None: flat exchange; see :meth:`connect_layout`).
        self.layout = None
        self._layout_resolved = False
        self.expected_layout = None   # a checkpoint's layout, compared once the layout is known
        self._cv = threading.Condition()
        self._grads: Dict[str, torch.Tensor] = {}
        self._results: Dict[str, torch.Tensor] = {}
        self.handoff = StreamHandoff()
        self._marks: Dict[str, HandoffMark] = {}     # name -> its gradient's mark (the submitting thread's)
        self._result_marks: List[HandoffMark] = []   # the step's buckets' result marks
        self._flush = False
        self._worker: Optional[threading.Thread] = None
        self._worker_error: Optional[BaseException] = None
        self.totals = StepTotals()   # the step in progress's counts
        self._nonfinite = False
        self._snapshots: List[tuple] = []
        self._partition: Optional[List[List[str]]] = None

    # -- a step -------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """True while a step has gradients submitted and not yet exchanged."""
        return bool(self._grads)

    def submit(self, name: str, grad: torch.Tensor) -> None:
        """Record ``name``'s gradient for this step (its result is later written into it when
        contiguous); with a plan and ``overlap``, start the communication thread."""
        with self._cv:
            if name in self._grads:
                raise RuntimeError(f"{self.owner}: {name!r} compressed twice before its exchange")
            self._grads[name] = grad.detach()
            self._marks[name] = self.handoff.record("grad", (grad,))
            if self._worker is None and self._can_overlap():
                self._worker = threading.Thread(target=self._worker_main, name="hgc-exchange", daemon=True)
                self._worker.start()
            self._cv.notify_all()

    def finish(self) -> Dict[str, torch.Tensor]:
        """Exchange what is left of the step (or wait for the thread), close the step, and
        return name -> mean over ranks for every submitted name."""
        with self._cv:
            self._flush = True
            self._cv.notify_all()
        try:
            if self.state.memory.needs_all_grads:
                self.handoff.wait_all(list(self._marks.values()))   # it reads every gradient here
                self.state.memory.begin_step(self._grads, self.communicator().size)
            if self._worker is not None:
                self._worker.join()
                if self._worker_error is not None:
                    raise self._worker_error
            else:
                self._run_buckets()
        finally:
            exchanged = list(self._grads)
            self._worker, self._worker_error, self._flush = None, None, False
            self._grads, self._marks = {}, {}
        return self.close_step(exchanged)

    def close_step(self, exchanged: Sequence[str]) -> Dict[str, torch.Tensor]:
        """End the step whose buckets exchanged ``exchanged``: when some rank had a non-finite
        gradient, roll the memory back and make every result NaN; record the step's stats, advance
        the state's step, (re)plan the buckets from ``exchanged``; return name -> mean over ranks
        (and forget them). The calling thread's streams first wait for every bucket's results."""
        self.wait_results()
        if self._nonfinite:
            self._skip_step()
        self._snapshots = []
        self.stats.record_step(self.totals)
        self.totals = StepTotals()
        self.state.end_step()
        if self.bucket_bytes is not None and (self.plan is None or set(exchanged) != self.plan.names):
            in_order = sorted(exchanged, key=self.registration.__getitem__, reverse=True)
            self.plan = BucketPlan(in_order, {n: self.sizes[n] for n in in_order}, self.bucket_bytes)
        results, self._results = self._results, {}
        return results

    def wait_results(self) -> None:
        """Make the calling thread's current streams wait for the results of every bucket closed
        so far in this step (their ``result`` marks), and mark the results in use there."""
        with self._cv:
            marks, self._result_marks = self._result_marks, []
            results = list(self._results.values())
        self.handoff.wait_all(marks, results)

    def abort_step(self) -> None:
        """Forget a step interrupted by a failed collective (Horovod elastic): pending gradients,
        partial results and totals; the thread, if any, is joined (up to 60 s)."""
        with self._cv:
            self._flush = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=60)
        self._grads, self._worker, self._worker_error, self._flush = {}, None, None, False
        self._marks, self._result_marks = {}, []
        self._results.clear()
        self.totals, self._nonfinite, self._snapshots = StepTotals(), False, []

    def fail_step(self) -> None:
        """Forget a step that failed part-way (the DDP hook's): the memory of its buckets back to
        their snapshots (where the step began), then :meth:`abort_step`."""
        for snapshot in reversed(self._snapshots):
            self.state.restore(snapshot)
        self.abort_step()

    def _skip_step(self) -> None:
        """Some rank had a non-finite gradient: undo the memory updates of this step's earlier
        buckets and make every result NaN (on every rank alike, so all skip the step)."""
        for snapshot in reversed(self._snapshots):
            self.state.restore(snapshot)
        for r in self._results.values():
            r.fill_(float("nan"))
        self.stats.nonfinite_steps += 1
        self._nonfinite = False

    def exchange(self, grads: Mapping[str, torch.Tensor],
                 partition: Optional[Sequence[Sequence[str]]] = None) -> Dict[str, torch.Tensor]:
        """One whole step at once: name -> mean over ranks (written into contiguous gradients).

        ``partition``: the buckets, exchanged in that order (bucket j tagged ``str(j)``): every
        name of ``grads`` in exactly one bucket, the same partition on every rank. None: the
        engine's own buckets (one bucket, or the ``bucket_bytes`` plan)."""
        if self._grads:
            raise RuntimeError(f"{self.owner}: exchange() during a step in progress through compress()")
        unknown = sorted(set(grads) - set(self.order))
        if unknown:
            raise KeyError(f"{self.owner}: exchange() got unknown names {unknown[:5]}")
        if partition is not None:
            partition = [list(b) for b in partition]
            listed = [n for b in partition for n in b]
            if sorted(listed) != sorted(grads):
                raise ValueError(f"{self.owner}: exchange(partition=...) must list every name of grads exactly once "
                                 f"(missing {sorted(set(grads) - set(listed))[:5]}, extra or repeated "
                                 f"{sorted(n for n in set(listed) if listed.count(n) != (n in grads))[:5]})")
        self._grads = {n: g.detach() for n, g in grads.items()}
        mark = self.handoff.record("grad", self._grads.values())
        self._marks = {n: mark for n in self._grads}
        self._partition = partition
        try:
            return self.finish()
        finally:
            self._partition = None

    # -- buckets ------------------------------------------------------------------------
    def _can_overlap(self) -> bool:
        # DGC's clipping needs the whole step's gradient norm: nothing can leave before it.
        if not (self.overlap and self.plan is not None and not self.state.memory.needs_all_grads):
            return False
        return _threads_allowed(self.communicator())

    def _worker_main(self) -> None:
        try:
            self._run_buckets()
        except BaseException as exc:  # re-raised by the flushing thread
            self._worker_error = exc

    def _run_buckets(self) -> None:
        """Exchange the plan's buckets in order (each once all its gradients are in, or at the
        flush), then the names outside the plan; without a plan, everything as one bucket."""
        if self._partition is not None:
            for j, names in enumerate(self._partition):
                self._exchange_bucket(names, tag=str(j), snapshot=True)
            return
        if self.plan is None:
            with self._cv:
                names = sorted(self._grads, key=self.order.__getitem__)
            self._exchange_bucket(names, tag="all")
            return
        for j, names_j in enumerate(self.plan.buckets):
            with self._cv:
                self._cv.wait_for(lambda: self._flush or all(n in self._grads for n in names_j))
                names = [n for n in names_j if n in self._grads]
            self._exchange_bucket(names, tag=str(j))
        with self._cv:  # names outside the plan are known only once every gradient is in
            self._cv.wait_for(lambda: self._flush)
            extra = sorted((n for n in self._grads if n not in self.plan.names), key=self.order.__getitem__)
        self._exchange_bucket(extra, tag="extra")  # on every rank, even when empty: the check finds a mismatch

    def _exchange_bucket(self, names: List[str], tag: str, snapshot: Optional[bool] = None) -> None:
        """One bucket, synchronously: preamble, pattern, results (under the stall watchdog).
        ``snapshot``: keep the bucket's memory for a skipped step (default: when the step has
        a bucket plan, i.e. several buckets)."""
        comm = self.communicator()
        with self._cv:
            grads = {n: self._grads[n] for n in names}
            marks = [self._marks.get(n) for n in names]
        self.handoff.wait_all(marks)   # this thread's stream after the work that wrote the gradients
        job = self.bucket_job(names, grads, tag, comm)
        overlap = self.pipeline_bytes is not None and _threads_allowed(comm)   # the wire thread may call comm
        with self.watchdog.guard(self.timeout, job.what):
            self.driver.run(self.bucket_steps(comm, job, self.plan is not None if snapshot is None else snapshot,
                                              overlap))

    def bucket_steps(self, comm, job: BucketJob, snapshot: bool, overlap: bool = False) -> Steps:
        """One bucket after :meth:`bucket_job`, as a request sequence (:mod:`.requests`) that any
        driver runs: the preamble (:func:`~.preamble.preamble_steps`), :meth:`open_bucket`, the
        pattern's own sequence, :meth:`close_bucket`. ``snapshot``: as :meth:`open_bucket`'s;
        ``overlap``: the driver can keep collectives in flight (pipelined chunks)."""
        nonfinite = yield from preamble_steps(comm, self.owner, job.signature, job.measured.nonfinite,
                                              self.check_agreement, self.stats)
        bucket = self.open_bucket(job, nonfinite, snapshot)
        if bucket is not None:
            self.close_bucket(job, (yield from self.patterns[job.pattern].steps(comm, bucket, self.stats, self.totals,
                                                                               overlap)))

    # -- one bucket, step by step (the synchronous path above; the DDP hook's asynchronous one) --
    def bucket_job(self, names: Sequence[str], grads: Mapping[str, torch.Tensor], tag: str, comm) -> BucketJob:
        """Everything about a bucket decided before its first collective: pattern, the preamble's
        signature, whether this rank holds a non-finite gradient (from the encode's own first
        pass where the codec has one, :mod:`horovod_gradcomp.exchange.nonfinite_check`). Writes no state."""
        grads = {n: grads[n].detach() for n in names}
        self.connect_layout(comm)
        pattern = self.choose_pattern(grads, comm.size)
        others = [r for r in range(comm.size) if r != comm.rank]
        what = (f"{self.owner}: step {self.state.step}, bucket {tag} ({len(names)} tensors, {pattern}), rank "
                f"{comm.rank} waiting for ranks {others}")
        signature = [self.codec.agreement_key(), self.state.memory.agreement_key(), f"bucket {tag} {pattern}",
                     f"world size {comm.size}"] + ([f"layout {self.layout.key()}"] if pattern == "hierarchical" else []) + [f"{n}:{tuple(g.shape)}:{g.dtype}" for n, g in grads.items()]
        measured = measure_bucket(self.codec, self.state.memory, pattern, self.patterns[pattern], grads, comm.size,
                                  self.stats)
        return BucketJob(list(names), grads, tag, pattern, signature, comm.size, comm.rank, what, measured)

    def open_bucket(self, job: BucketJob, nonfinite: bool, snapshot: bool) -> Optional[Bucket]:
        """After the preamble (``nonfinite``: some rank flagged one): the :class:`Bucket` for the
        pattern, or None when there is nothing to exchange (no names; or a non-finite gradient
        somewhere: the results are NaN, nothing is encoded, the memory stays as it was).
        ``snapshot``: keep the bucket's memory first, for a step that is later skipped."""
        self.totals.add(sent=allgather_wire_bytes(PREAMBLE_BYTES, job.k))
        if not job.names:
            return None
        outs = {n: (g if g.is_contiguous() else None) for n, g in job.grads.items()}
        if nonfinite:
            self._nonfinite = True
            results = {n: (outs[n] if outs[n] is not None else torch.empty_like(g)).fill_(float("nan"))
                       for n, g in job.grads.items()}
            self.close_bucket(job, BucketOutcome(results, 0, 0))
            return None
        if snapshot:
            self._snapshots.append(self.state.snapshot(*self.patterns[job.pattern].memory_keys(job.names, job.rank)))
        return Bucket(job.names, job.grads, self.state, self.order, outs, job.measured)

    def close_bucket(self, job: BucketJob, outcome: BucketOutcome) -> None:
        """Keep the bucket's results (scaled only where the codec was given an ``lr_warmup_steps``
        opt-in, :mod:`.step_ramp`), marked on this thread's streams (:meth:`wait_results`), and add
        its counts to the step's totals."""
        apply_ramp(outcome.results.values(), ramp_factor(self.codec.lr_warmup_steps, self.state.step))
        mark = self.handoff.record("result", outcome.results.values())
        with self._cv:
            self._results.update(outcome.results)
            self._result_marks.append(mark)
            if outcome.nonfinite:  # found in the received payloads (measure kind "payloads"): on every rank
                self._nonfinite = True
        self.totals.add(tensors=len(job.names), payload=outcome.payload,
                         numel=sum(g.numel() for g in job.grads.values()), sent=outcome.sent,
                         intra=outcome.info.get("intra", 0.0) if outcome.info else 0.0)
        self.totals.k = job.k

    def record_sparse(self, *, numel: int, payload: int, sent: float, k: int, nonfinite: bool) -> None:
        """A sparse DDP bucket that the hook exchanged uncompressed
        (:mod:`horovod_gradcomp.ddp.sparse_exchange`): its counts go into the step's totals, and a
        non-finite mean (the same on every rank) skips the whole step as a dense bucket's would."""
        with self._cv:
            if nonfinite:
                self._nonfinite = True
        self.totals.add(tensors=1, payload=payload, numel=numel, sent=sent)
        self.totals.k = k

    @property
    def step_nonfinite(self) -> bool:
        """True when some bucket of the step in progress found a NaN or Inf on some rank (the
        step's results will all be NaN when it closes)."""
        return self._nonfinite

    def choose_pattern(self, grads: Mapping[str, torch.Tensor], k: int) -> str:
        """This bucket's pattern (the same on every rank: it depends on shapes, K and the step only):
        "dense" during the codec's ``warmup_steps`` (:mod:`horovod_gradcomp.exchange.dense`)."""
        if self.state.step < self.codec.warmup_steps:
            return "dense"
        if self.pattern != "auto":
            return self.pattern
        if self.layout is not None:   # "auto" on a multi-level layout (connect_layout)
            return "hierarchical"
        return self.flat_auto(grads, k)

    def flat_auto(self, grads: Mapping[str, torch.Tensor], k: int) -> str:
        """The flat ``"auto"`` rule among ``k`` ranks: "allgather" for variable-size codecs, K <= 2 and
        under ``AUTO_MIN_BYTES`` per rank (latency-bound); else the pattern sending fewer bytes per rank."""
        two_phase = self.patterns.get("two_phase")
        if two_phase is None or k <= 2 or not grads:
            return "allgather"
        entries = [(n, tuple(g.shape), g.dtype) for n, g in grads.items()]
        allgather = (k - 1) * sum(self.codec.payload_nbytes(s, dt) for _, s, dt in entries)
        if allgather < AUTO_MIN_BYTES:
            return "allgather"
        plan = two_phase.plan(entries, k)
        return "two_phase" if max(plan.sent_bytes(r) for r in range(k)) < allgather else "allgather"

    def connect_layout(self, comm) -> None:
        """Find the node layout and make the hierarchical pattern's sub-communicators, once, where
        the pattern may need them: ``pattern="hierarchical"``, or ``"auto"`` with a layout given
        (``ranks_per_node``, ``HOROVOD_GRADCOMP_RANKS_PER_NODE``) or a launcher that says a node
        holds fewer than K ranks (``launcher_hint``: a one-host job runs no discovery collectives).
        Collectives on ``comm``, under the stall watchdog. Every rank calls it at its first bucket
        (the DDP hook: at ``register``). Raises on unequal nodes with ``pattern="hierarchical"``,
        and when a loaded checkpoint was written on another layout."""
        if self._layout_resolved:
            return
        wanted = self.pattern == "hierarchical" or (
            self.pattern == "auto" and comm.size > 2 and can_split(comm)
            and (self.ranks_per_node is not None or launcher_hint(comm.size)))
        if wanted:
            with self.watchdog.guard(self.timeout, f"{self.owner}: finding the nodes (rank {comm.rank} of {comm.size})"):
                layout = discover_layout(comm, self._ranks_per_node_option, self.owner)
                if self.pattern == "hierarchical":
                    require_equal(layout, self.owner)
                if self.pattern == "hierarchical" or layout.multi_level:
                    node, peers = sub_communicators(comm, layout, self.owner)
                    self.patterns["hierarchical"].connect(layout, node, peers)
                    self.state.memory.set_mean_of(node.size)   # DGC: L*d from node means unless given
                    self.layout = layout
        self._layout_resolved = True
        self.check_layout()

    def check_layout(self) -> None:
        """Raise ValueError when a loaded checkpoint's layout (:attr:`expected_layout`, set by
        the adapters' ``load_state_dict``) is not the one in use (once it is known): the residuals
        of a hierarchical exchange belong to its shards, and those depend on the layout."""
        if not self._layout_resolved or self.expected_layout is None:
            return
        saved, now = self.expected_layout, (self.layout.key() if self.layout is not None else "flat")
        self.expected_layout = None
        if saved != now:
            describe = (lambda key: "the flat exchange" if key == "flat"
                        else f"a hierarchical exchange over nodes {key}")
            raise ValueError(f"{self.owner}: this checkpoint was written by {describe(saved)}; this job runs "
                             f"{describe(now)}. The error-feedback state belongs to the node shards of that layout: "
                             "resume with the same layout (ranks_per_node / HOROVOD_GRADCOMP_RANKS_PER_NODE, same "
                             "launch), or start the compression state fresh (do not load it)")

    @property
    def layout_known(self) -> bool:
        """True once :meth:`connect_layout` has run (the layout in use is then final)."""
        return self._layout_resolved

    def layout_key(self):
        """What a checkpoint records: the layout in use as lists of ranks, or ``"flat"``."""
        return self.layout.key() if self.layout is not None else "flat"


def _threads_allowed(comm) -> bool:
    """False (with one warning per process) when the MPI library did not grant
    ``MPI_THREAD_MULTIPLE``: the exchange then runs on the main thread only."""
    global _warned_thread_level
    if not isinstance(comm, ThreadLevelCommunicator) or comm.thread_multiple:
        return True
    if not _warned_thread_level:
        _warned_thread_level = True
        warnings.warn("horovod_gradcomp: the MPI library did not grant MPI_THREAD_MULTIPLE; no communication "
                      "thread: buckets are exchanged at synchronize() on the main thread (no overlap with backward) "
                      "and in one collective each (no pipelined chunks)", RuntimeWarning, stacklevel=2)
    return False
