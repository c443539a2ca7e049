"""A DDP communication hook that exchanges gradients through the codecs, bucket by bucket.

``state = hgc.ddp.register(ddp_model, codec, **options)`` builds the codec's
``hgc.Compression`` (the same factories, error feedback, DGC memory, patterns and statistics
as under Horovod) on a :class:`~horovod_gradcomp.transports.torch_dist.TorchDistributedCommunicator`
over DDP's own process group (or ``group=``), and registers a hook that, for each bucket DDP
hands over during backward:

1. records the bucket (its parameters' names and gradient views) and returns at once a
   ``torch.futures.Future`` that completes with the bucket's buffer holding the mean over ranks;
2. on the sequencer thread (below): runs the bucket's request sequence (:meth:`StepEngine.bucket_steps
   <horovod_gradcomp.exchange.engine.StepEngine.bucket_steps>`: preamble, encode, collectives), its
   collectives issued with ``async_op=True`` (:mod:`horovod_gradcomp.ddp.future_driver`); a waiter
   thread per collective in flight waits for it and resumes the bucket where it stopped, in turn
   with the sequencer, while backward goes on computing the next buckets.

Order. Collectives pair across ranks by the order in which each rank issues them, and the
completions that resume a bucket arrive in an order that differs between ranks. So one thread
at a time runs bucket steps (the sequencer ``hgc-ddp``, which takes DDP's buckets in order, or
the waiter whose collective just completed; each holds the state's turn lock), and one bucket
at a time may issue collectives: bucket j+1 starts once bucket j has issued its last collective
(buckets in DDP's order, the same on every rank; bucket j's last bytes may still be on the wire). Chaining collectives
directly in the callbacks, as PyTorch's PowerSGD hook does, pairs different buckets' collectives
on gloo when a model spans several buckets; this hook does not.

Threads. No Python runs on the backend's threads (why: :mod:`horovod_gradcomp.transports.torch_dist`):
each bucket's future is completed by the hook's thread that closes the step; at exit the hook
waits (bounded) until its threads are idle (:mod:`horovod_gradcomp.ddp.daemon_threads`).

Streams (CUDA): every hand-over between threads goes through the engine's
:class:`~horovod_gradcomp.exchange.stream_handoff.StreamHandoff` (its module lists the hook's).

Steps and results. A step ends when DDP has handed over its last bucket and every bucket's
exchange is done: then the engine closes the step exactly as on the Horovod path
(:meth:`StepEngine.close_step`: a NaN or Inf on any rank rolls the memory back and makes every
result NaN), and every bucket's future completes. The stream positions, residuals and results
are those of ``compression.engine.exchange(grads, partition=state.last_partition)``, over any
transport: the tests check them bitwise. The user's side of what follows (one exchange per step
for DGC's ``clip_norm`` or ``per_bucket=False``, sparse buckets, the errors ``backward()``
raises) is docs/guide/ddp.md.

Errors. DDP casts a future's value to a tensor, so a future cannot carry the exception: a failed
step's futures complete with their buffers and ``backward()`` raises its
:class:`DDPExchangeError` (how: :func:`_raise_after_ddp`; outside a backward pass the futures
raise it, :meth:`_Step.future_for`); the memory of its buckets is rolled back
(:meth:`StepEngine.fail_step`). A rank that stops taking part is ended by the stall watchdog
(``timeout=``, :mod:`horovod_gradcomp.ddp.stall`).

Process group. DDP's own unless ``group=`` is given (gloo moves the bytes from the CPU, NCCL
from the current CUDA device: written, not run). With ``find_unused_parameters=True`` DDP issues
a collective of its own after the last bucket while the hook's may still be issued, so the hook
then uses a new group with the same ranks and backend (created in ``register``, on every rank).
"""
from __future__ import annotations

import atexit
import functools
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..codecs import available_codecs
from ..exchange.timeline import Interval
from ..flags import require_flag
from ..hvd_adapter.adam_defaults import AdamDefaultsGuard
from ..hvd_adapter.factories import Compression
from ..state.compression_holder import CompressionHolder
from ..transports.torch_dist import TorchDistributedCommunicator
from .arguments import refuse_options, require_ddp_model
from .future_driver import Waiting, advance, with_known_sizes
from .daemon_threads import DaemonThreads
from .gloo_exit import hold_backward_context
from .sparse_exchange import is_sparse, sparse_job
from .stall import process_watchdog


class DDPExchangeError(RuntimeError):
    """A step of the DDP hook failed (its message names the step, bucket and rank; the cause
    is chained as ``__cause__``)."""


#: At exit, how long to wait for the hook's threads of every live state, in all.
_EXIT_JOIN_S = 10.0
_warned_one_exchange = False
_LIVE_STATES: "weakref.WeakSet" = weakref.WeakSet()


class _Step:
    """One backward pass: its buckets' jobs and names, and the futures returned to DDP, each
    completed with its bucket's buffer when the step closes (see :meth:`future_for` for a step
    that fails)."""

    def __init__(self, number: int):
        self.number = number
        #: the step's error is raised by a callback of the autograd engine (see the module doc);
        #: otherwise each future raises it from wait()
        self.raises_from_backward = False
        self.sparse_results: List[torch.Tensor] = []   # the sparse buckets' means (the buffers)
        self.densified: List[Tuple[torch.Tensor, torch.Tensor]] = []   # sparse_as_dense: (dense copy, buffer)
        self._lock = threading.Lock()
        self._futures: List[Tuple[torch.futures.Future, torch.Tensor]] = []
        self._settled = False
        self.partition: List[List[str]] = []
        self.pending: Dict[str, torch.Tensor] = {}   # one exchange per step: the grads so far
        self.marks: list = []                         # ... and their stream marks
        self.running = 0                              # jobs started and not finished
        self.all_in = False                           # DDP handed over the last bucket
        self.error: Optional[BaseException] = None

    def future_for(self, buffer: torch.Tensor) -> torch.futures.Future:
        """A future of ``buffer``: completed when the step closes, at once if it already has.
        For a CUDA buffer a CUDA-aware future (completing it records the completing thread's
        stream; DDP's wait orders its own stream after it). When the step's error is not raised
        from backward (see the module doc), what DDP gets is a child future whose ``wait()``
        raises it."""
        fut: torch.futures.Future = (torch.futures.Future(devices=[buffer.device]) if buffer.device.type == "cuda"
                                     else torch.futures.Future())
        out = fut if self.raises_from_backward else fut.then(_raise_error_value)
        with self._lock:
            if not self._settled:
                self._futures.append((fut, buffer))
                return out
        self._complete(fut, buffer)
        return out

    def _complete(self, fut: torch.futures.Future, buffer: torch.Tensor) -> None:
        if self.error is None or self.raises_from_backward:
            fut.set_result(buffer)      # DDP takes the buffer; the error is raised from backward()
        else:
            fut.set_result(self.error)  # the child future raises it

    def settle(self) -> None:
        """Complete every bucket's future: with its buffer, or with :attr:`error` when the step
        failed (set it first); once."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
            futures, self._futures = self._futures, []
        for fut, buffer in futures:
            self._complete(fut, buffer)


def _raise_error_value(fut: torch.futures.Future):
    """A ``then`` callback: the parent's value, or raise it when it is the step's error."""
    value = fut.value()
    if isinstance(value, BaseException):
        raise value
    return value


def _raise_after_ddp(step: _Step) -> bool:
    """Queue on the autograd engine a callback that queues another: the second runs after DDP's
    end-of-backward callback (queued when DDP marked its last bucket ready, so before the first
    runs) and raises ``step.error`` if the step failed. False when not in a backward pass."""
    engine = torch.autograd.Variable._execution_engine

    def after_ddp():
        if step.error is not None:
            raise step.error

    def first():
        engine.queue_callback(after_ddp)
    try:
        engine.queue_callback(first)
    except RuntimeError:   # "Final callbacks can only be installed during backward pass"
        return False
    return True


@dataclass(eq=False)
class _Running:
    """A job in flight: its generator, bucket tag, step, watchdog guard, and the devices of its
    gradients (where a move to another thread is marked)."""
    gen: Any
    tag: str
    step: _Step
    guard: Any
    devices: tuple = ()


class DDPCompressionState(CompressionHolder):
    """The hook's state (what :func:`register` returns).

    Fields:
        compression: the :class:`~horovod_gradcomp.hvd_adapter.compression.CodecCompression`
            (codec, memory, engine, statistics).
        communicator: its :class:`TorchDistributedCommunicator` (the hook's process group).
        per_bucket: True when each bucket is exchanged as DDP hands it over; False: one
            exchange per step (DGC, or ``per_bucket=False``).
        last_partition: the names of each bucket of the last step, in exchange order (DDP's
            buckets, or one bucket of every name in one-exchange mode).
        timeline: an optional :class:`~horovod_gradcomp.exchange.timeline.Timeline`; when set,
            every collective is recorded from its start to its completion (phase ``collective``,
            thread ``"hgc-ddp bucket <tag>: <kind>"``), each bucket DDP hands over as a zero-length
            ``bucket_ready`` interval on the calling thread, and the engine's timed blocks.
    """

    def __init__(self, compression, names: Dict[int, str], per_bucket: bool = True, sparse_as_dense: bool = False):
        self.compression = compression
        self.sparse_as_dense = require_flag("DDP hook", "sparse_as_dense", sparse_as_dense)
        self.engine = compression.engine
        self.handoff = self.engine.handoff
        self.communicator = compression.communicator
        self._names = names
        self.per_bucket = (require_flag("DDP hook", "per_bucket", per_bucket)
                           and not compression.state.memory.needs_all_grads)
        self.last_partition: List[List[str]] = []
        self._timeline = None
        self._step: Optional[_Step] = None
        self._steps = 0
        self._waiting: List[tuple] = []        # jobs not started yet, in order
        self._active: Optional[_Running] = None  # the job allowed to issue collectives
        self._open: List[_Step] = []            # steps neither closed nor failed
        self._turn = threading.Lock()   # held by the sequencer or a waiter running a bucket's steps (module doc: Order)
        self._sequencer = DaemonThreads("hgc-ddp", limit=1, setup=self._set_device, on_error=self._fail_open)
        self._waiters = DaemonThreads("hgc-ddp-wait", setup=self._set_device)
        _LIVE_STATES.add(self)
        if per_bucket and not self.per_bucket:
            _warn_one_exchange(compression)

    @property
    def timeline(self):
        return self._timeline

    @timeline.setter
    def timeline(self, timeline) -> None:
        self._timeline = timeline
        self.engine.stats.timeline = timeline

    # -- the hook (DDP's thread) -----------------------------------------------------------
    def on_bucket(self, bucket) -> torch.futures.Future:
        """Record ``bucket`` and return its future (see the module doc)."""
        if self._timeline is not None:
            now = time.perf_counter()
            self._timeline.add("bucket_ready", now, now)
        step = self._step
        if step is None:
            step = _Step(self._steps)
            step.raises_from_backward = _raise_after_ddp(step)
            self._step = step
            self._steps += 1
            self._open.append(step)
        buffer = bucket.buffer()
        fut = step.future_for(buffer)
        last, tag = bucket.is_last(), str(bucket.index())
        if last:
            self._step = None          # the next backward is a new step
        names = [self._names.get(id(p)) for p in bucket.parameters()]
        if None in names:
            self._post(self._fail, step, tag, KeyError("a bucket holds a parameter that is not in the module given "
                                                       "to hgc.ddp.register()"))
        elif is_sparse(buffer) and self.sparse_as_dense:   # its dense copy through the codec, written back at close
            dense = buffer.to_dense()
            step.densified.append((dense, buffer))
            mark = self.handoff.record("grad", (dense,))
            self._post(self._hand_over, step, tag, names, {names[0]: dense}, last, mark)
        elif is_sparse(buffer):   # DDP's bucket of one sparse gradient: the buffer is the gradient
            mark = self.handoff.record("grad", (buffer._values(),))
            self._post(self._hand_over, step, tag, names, {names[0]: buffer}, last, mark, True)
        else:
            mark = self.handoff.record("grad", (buffer,))   # on the stream backward wrote it on
            self._post(self._hand_over, step, tag, names, dict(zip(names, bucket.gradients())), last, mark)
        return fut

    # -- the sequencer thread -------------------------------------------------------------
    def _post(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the sequencer thread, after everything posted before."""
        self._sequencer.post(self._in_turn, fn, *args)

    def _in_turn(self, fn, *args) -> None:
        with self._turn:
            fn(*args)

    def _set_device(self) -> None:
        if self.communicator.device.type == "cuda":
            torch.cuda.set_device(self.communicator.device)

    def _fail_open(self, exc: BaseException) -> None:
        """A bug in the sequencer must not leave DDP waiting forever: fail every open step."""
        for step in list(self._open):
            self._fail(step, "?", exc)

    def _hand_over(self, step: _Step, tag: str, names: List[str], grads: Dict[str, torch.Tensor], last: bool,
                   mark=None, sparse: bool = False):
        if step.error is not None:
            return
        if sparse:   # its own job in either mode, in DDP's order (not part of the codec's buckets)
            step.sparse_results.append(grads[names[0]])
            self._queue_job(step, tag, names, grads, snapshot=False, marks=[mark], sparse=True)
        elif self.per_bucket:
            step.partition.append(names)
            self._queue_job(step, tag, names, grads, snapshot=True, marks=[mark])
        else:
            step.pending.update(grads)
            step.marks.append(mark)
        if last:
            step.all_in = True
            if not self.per_bucket:
                order = self.engine.order
                names_all = sorted(step.pending, key=lambda n: order.get(n, -1))
                step.partition = [names_all]
                self._queue_job(step, "all", names_all, step.pending, snapshot=False, begin_step=True,
                                marks=step.marks)
            self._maybe_close(step)

    def _queue_job(self, step: _Step, tag: str, names, grads, snapshot: bool, begin_step: bool = False, marks=(),
                   sparse: bool = False):
        step.running += 1
        self._waiting.append((step, tag, names, grads, snapshot, begin_step, list(marks), sparse))
        self._start_next()

    def _start_next(self) -> None:
        while self._active is None and self._waiting:
            step, tag, names, grads, snapshot, begin_step, marks, sparse = self._waiting.pop(0)
            if step.error is not None:
                step.running -= 1
                continue
            try:
                self.handoff.wait_all(marks)   # this thread's stream after backward's writes of the bucket
                comm = self.communicator
                if sparse:
                    others = [r for r in range(comm.size) if r != comm.rank]
                    what = (f"hgc.ddp: step {step.number}, sparse bucket {tag} ({names[0]}), rank {comm.rank} "
                            f"waiting for ranks {others}")
                    gen = sparse_job(comm, grads[names[0]], self.engine)
                else:
                    if begin_step and self.compression.state.memory.needs_all_grads:
                        self.compression.state.memory.begin_step(grads, comm.size)
                    job = self.engine.bucket_job(names, grads, tag, comm)
                    what, gen = job.what, with_known_sizes(self.engine.bucket_steps(comm, job, snapshot))
                guard = process_watchdog().guard(self.engine.timeout, what)
                guard.__enter__()
                running = _Running(gen, tag, step, guard, tuple({g.device for g in grads.values()}))
            except BaseException as exc:  # noqa: BLE001 - the step's futures carry it
                step.running -= 1
                self._fail(step, tag, exc)
                continue
            self._active = running
            self._advance(running, None)

    def _advance(self, job: _Running, pending=None) -> None:
        """Resume ``job`` with the result of ``pending`` (None: start it); issue what it asks next
        (:func:`~horovod_gradcomp.ddp.future_driver.advance`) and hand the wait to a waiter thread."""
        if job.step.error is not None:
            self._end_job(job)
            return
        try:
            # on CUDA, waiting orders this thread's stream after the work
            value = pending.wait() if pending is not None else None
            waiting = advance(job.gen, value)
        except StopIteration:
            self._end_job(job)
            self._maybe_close(job.step)
            return
        except BaseException as exc:  # noqa: BLE001 - the step's futures carry it
            self._fail(job.step, job.tag, exc)   # first: no later bucket of the step may start
            self._end_job(job)
            return
        resume = self.handoff.record("resume", devices=job.devices)   # the job goes on on a waiter thread
        self._waiters.post(self._await, job, waiting, resume)
        if waiting.last_out and self._active is job:
            self._active = None
            self._start_next()

    def _await(self, job: _Running, waiting: Waiting, resume=None) -> None:
        """A waiter thread: wait for one collective (its error is raised again where the job
        resumes), record it, and resume its job in turn (its stream after the issuing thread's
        ``resume`` mark)."""
        try:
            waiting.pending.wait()
        except BaseException:  # noqa: BLE001 - pending.wait() raises it again in _advance
            pass
        if self._timeline is not None:
            self._timeline.intervals.append(Interval("collective", f"hgc-ddp bucket {job.tag}: {waiting.kind}",
                                                    waiting.issued_at, time.perf_counter()))
        with self._turn:
            try:
                self.handoff.wait(resume)
                self._advance(job, waiting.pending)
            except BaseException as exc:  # noqa: BLE001
                self._fail_open(exc)

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until none of the hook's threads runs anything (each
        collective in flight waited for and its bucket resumed); True if so."""
        deadline = time.monotonic() + timeout
        while True:
            if not (self._waiters.wait_idle(max(0.0, deadline - time.monotonic()))
                    and self._sequencer.wait_idle(max(0.0, deadline - time.monotonic()))):
                return False
            if self._waiters.wait_idle(0):    # the sequencer started no new wait meanwhile
                return True

    def _end_job(self, job: _Running) -> None:
        job.guard.__exit__(None, None, None)
        job.step.running -= 1
        if self._active is job:
            self._active = None
            self._start_next()

    def _maybe_close(self, step: _Step) -> None:
        """Close ``step`` once every bucket is in and no job of it runs. Called again for a step
        already closed (a job that ran to its end inside :meth:`_queue_job`, as one may where no
        collective waits, closes the step before :meth:`_hand_over` asks): nothing to do."""
        if step.error is not None or not step.all_in or step.running or step not in self._open:
            return
        try:
            skipped = self.engine.step_nonfinite
            self.engine.close_step([n for names in step.partition for n in names])
            self.compression.index.end_step()
            if skipped:   # every result of the step NaN, the sparse means too
                for t in step.sparse_results:
                    t._values().fill_(float("nan"))
            with torch.no_grad():
                for dense, buffer in step.densified:   # sparse_as_dense: the mean back into the sparse gradient
                    buffer.copy_(dense.to_sparse(buffer.sparse_dim()))
        except BaseException as exc:  # noqa: BLE001
            self._fail(step, "close", exc)
            return
        self.last_partition = step.partition
        self._open.remove(step)
        step.settle()

    def _fail(self, step: _Step, tag: str, exc: BaseException) -> None:
        """Fail ``step``: every future of it raises; the memory of its buckets is restored from
        their snapshots (per bucket: where the step began)."""
        if step.error is not None:
            return
        if step in self._open:
            self._open.remove(step)
        rank = getattr(self.communicator, "rank", "?")
        err = DDPExchangeError(f"hgc.ddp: step {step.number}, bucket {tag} failed on rank {rank}: "
                               f"{type(exc).__name__}: {exc}")
        err.__cause__ = exc
        step.error = err
        self.engine.fail_step()
        self.compression.index.end_step()
        step.settle()

    # -- introspection and checkpoints -----------------------------------------------------
    def stats(self) -> dict:
        """The compression's counters (see :mod:`horovod_gradcomp.exchange.stats`; one step per DDP
        iteration), plus ``padding_bytes``: bytes sent beyond the payloads when parts' sizes differ
        (the allgathers are padded to the largest part; not in ``bytes_sent``)."""
        return {**self.compression.stats(), "padding_bytes": self.communicator.padding_bytes}


def _warn_one_exchange(compression) -> None:
    global _warned_one_exchange
    if not _warned_one_exchange:
        _warned_one_exchange = True
        warnings.warn(f"hgc.ddp: {compression.codec.name} needs the whole step's gradient before it encodes "
                      "(DGC clips by the global norm): one exchange per step, after DDP hands over its last bucket; "
                      "no bucket's exchange overlaps backward", RuntimeWarning, stacklevel=3)


@atexit.register
def _join_at_exit() -> None:
    """Before Python shuts down: no hook thread may be inside torch (see the module doc)."""
    deadline = time.monotonic() + _EXIT_JOIN_S
    for state in list(_LIVE_STATES):
        state.wait_idle(max(0.0, deadline - time.monotonic()))


def _hook(state, bucket):  # no annotations: DDP compares them to Future[Tensor] objects, not strings
    return state.on_bucket(bucket)


def _hook_group(ddp_model, group):
    """The process group of the hook's collectives (see the module doc)."""
    if group is not None:
        return group
    import torch.distributed as dist
    own = ddp_model.process_group
    if getattr(ddp_model, "find_unused_parameters", False):
        return dist.new_group(ranks=dist.get_process_group_ranks(own), backend=dist.get_backend(own))
    return own


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, codec: str = "onebit", *, group=None,
             communicator: Optional[TorchDistributedCommunicator] = None, per_bucket: bool = True,
             sparse_as_dense: bool = False, **options) -> DDPCompressionState:
    """Register the compressed exchange on ``ddp_model`` and return its state. Call it on every
    rank at the same point (it may create a process group).

    ``codec``: a name of ``hgc.available_codecs()``; ``options`` go to its factory
    (``hgc.Compression.<codec>`` where there is one, else ``hgc.Compression.codec``), e.g.
    ``pattern="hierarchical", ranks_per_node=L`` (its node groups are created here). ``group``: the
    hook's process group (None: DDP's own; see the module doc). ``per_bucket``: exchange each DDP
    bucket as DDP hands it over (default; DGC with ``clip_norm`` still once per step) or once per
    step (False). ``sparse_as_dense``: a sparse gradient's bucket exchanged uncompressed as DDP's
    default does (False) or its dense copy through the codec, the mean written back (True). The
    options DDP's buckets replace (``bucket_bytes``, ``overlap``, ``transport``, ``process_set``)
    are refused. DGC's momentum, the Adam defaults (``optimizer=``) and the rest of the user's
    side: docs/guide/ddp.md."""
    require_ddp_model(ddp_model, "hgc.ddp.register")
    refuse_options(options, ("bucket_bytes", "overlap", "transport", "process_set"), "hgc.ddp.register",
                   "to the DDP hook (DDP's buckets are exchanged on a torch.distributed group: set bucket_cap_mb on "
                   "DDP, group= here)")
    named = [(n, p) for n, p in ddp_model.module.named_parameters() if p.requires_grad]
    if codec not in available_codecs():
        raise ValueError(f"hgc.ddp.register: unknown codec {codec!r}; available: {', '.join(available_codecs())} "
                         "(for DDP's own dense allreduce, register no hook)")
    factory = getattr(Compression, codec, None) or functools.partial(Compression.codec, codec)
    comm = communicator if communicator is not None else TorchDistributedCommunicator(_hook_group(ddp_model, group))
    compression = factory(named, communicator=comm, **options)
    if options.get("optimizer") is None:   # the Adam defaults at the first step() (adam_defaults.py)
        compression.adam_guard = AdamDefaultsGuard(compression, [p for _, p in named])
    compression.engine.connect_layout(comm)   # pattern="hierarchical": its groups, here on every rank (no-op otherwise)
    state = DDPCompressionState(compression, {id(p): n for n, p in named}, per_bucket=per_bucket,
                                sparse_as_dense=sparse_as_dense)
    ddp_model.register_comm_hook(state, _hook)
    hold_backward_context(ddp_model)   # PyTorch 2.13's abort at exit on gloo: see gloo_exit.py
    return state
