"""The ``compression=`` object of every codec: hooks in, buckets out, results back to Horovod.

Horovod calls ``compress(p.grad)`` from each gradient hook, allreduces what it returns, and
in ``synchronize()`` (run by ``step()``) calls ``decompress(output, ctx)`` for every
parameter, after every ``compress`` of the step (it submits the missing ones first). A
packed payload cannot be summed by Horovod, so:

1. ``compress`` records the gradient under its parameter's name and returns a one-element
   float32 placeholder holding 1.0.
2. Exchange, bucket by bucket, in an order every rank shares (never hook order): without
   ``bucket_bytes``, all gradients form one bucket exchanged at the first ``decompress``.
   With ``bucket_bytes``, from the second step on (the plan is built from the first step's
   names, see :mod:`horovod_gradcomp.buckets`) and ``overlap=True``, a communication thread
   exchanges bucket j as soon as its gradients are all in, while backward goes on. Each
   bucket: agreement check (one 16-byte allgather), encoding (with this rank's memory:
   error feedback or DGC state), then its pattern: ``allgather`` (everyone's payload to
   everyone) or ``two_phase`` (owner-of-1/K, :mod:`horovod_gradcomp.two_phase`).
3. Each ``decompress`` returns its tensor's mean over ranks times the reduced placeholder:
   1 for ``op=hvd.Average``, K for ``op=hvd.Sum``.

``pattern="auto"`` picks per bucket, identically on every rank, from the codec's layout:
``allgather`` for variable-size codecs, for K <= 2, and when the allgather would send less
than ``AUTO_MIN_BYTES`` per rank (latency-bound: two collectives cost more than the bytes
saved); otherwise whichever sends fewer bytes per rank (two-phase: about 2(K-1)/K payloads,
allgather: K-1).
"""
from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional

import numpy as np
import torch

from .allgather_exchange import AllgatherExchange
from .buckets import BucketPlan
from .codecs.base import Codec, Payload
from .comm import MPICommunicator, default_communicator
from .feedback import ErrorFeedback
from .param_index import ParamIndex
from .stats import ExchangeStats, allgather_wire_bytes, allreduce_wire_bytes
from .two_phase import TwoPhaseExchange

PATTERNS = ("allgather", "two_phase", "auto")
#: ``pattern="auto"`` keeps the single allgather below this many bytes sent per rank.
AUTO_MIN_BYTES = 1 << 16
AGREEMENT_BYTES = 16


def _placeholder_scale(output: torch.Tensor) -> float:
    """What Horovod's reduction made of the placeholder 1.0 (1 for Average, K for Sum)."""
    return float(output.reshape(-1)[0])


class CodecCompression:
    """Compressed exchange of every named parameter's gradient with one codec.

    Fields:
        codec: the :class:`~horovod_gradcomp.codecs.base.Codec` encoding each gradient.
        memory: the per-rank state between steps: :class:`~horovod_gradcomp.feedback.ErrorFeedback`
            residuals by name (``feedback`` is the same object), or DGC's momentum and
            accumulation (:class:`~horovod_gradcomp.dgc_memory.DGCMemory`).
        pattern: "allgather" | "two_phase" | "auto" (see the module doc).
        bucket_bytes: bucket size in gradient bytes (None: one bucket per step).
        overlap: exchange complete buckets from a communication thread during backward.
        communicator: where payloads travel (a duplicate of COMM_WORLD by default).
        check_agreement: before each bucket, verify (one 16-byte allgather) that all ranks
            exchange the same tensors with the same options; a mismatch raises
            :class:`~horovod_gradcomp.comm.ExchangeMismatchError` on every rank.
    """

    def __init__(self, codec: Codec, named_parameters, *, error_feedback: bool = True, memory=None,
                 pattern: str = "allgather", bucket_bytes: Optional[int] = None, overlap: bool = True,
                 communicator: Optional[MPICommunicator] = None, check_agreement: bool = True):
        if pattern not in PATTERNS:
            raise ValueError(f"Compression.{codec.name}: pattern must be one of {PATTERNS}, got {pattern!r}")
        variable = bool(getattr(codec, "variable_size", False))
        if pattern == "two_phase" and variable:
            raise ValueError(f"Compression.{codec.name}: pattern='two_phase' needs fixed-size payloads, but {codec!r} "
                             "has variable-size payloads; use pattern='allgather' (or 'auto')")
        if memory is not None and pattern == "two_phase" and not isinstance(memory, ErrorFeedback):
            raise ValueError(f"Compression.{codec.name}: pattern='two_phase' works with error feedback only")
        if bucket_bytes is not None:
            BucketPlan([], {}, bucket_bytes)  # validates
        self.codec = codec
        self.index = ParamIndex(named_parameters, owner=f"Compression.{codec.name}")
        self.memory = memory if memory is not None else ErrorFeedback(enabled=error_feedback)
        self.feedback = self.memory
        self.pattern = pattern
        self.bucket_bytes = bucket_bytes
        self.overlap = bool(overlap)
        self.communicator = communicator
        self.check_agreement = check_agreement
        self._allgather = AllgatherExchange(codec)
        self._two_phase = None if variable else TwoPhaseExchange(codec, communicator)
        self._shared_scale = bool(getattr(codec, "shared_scale", False))
        self._registration = {n: i for i, n in enumerate(self.index.names)}
        self._stats = ExchangeStats()
        self._step = 0
        self._plan: Optional[BucketPlan] = None
        self._cv = threading.Condition()
        self._grads: Dict[str, torch.Tensor] = {}
        self._results: Dict[str, torch.Tensor] = {}
        self._flush = False
        self._worker: Optional[threading.Thread] = None
        self._worker_error: Optional[BaseException] = None
        self._step_totals = self._zero_totals()

    # -- Horovod's Compressor interface -------------------------------------------
    def compress(self, tensor: torch.Tensor):
        """Record ``tensor`` (a parameter's ``.grad``); return the placeholder and its name."""
        with self._cv:
            name = self.index.name_of(tensor)
            if name in self._grads:
                raise RuntimeError(f"Compression.{self.codec.name}: {name!r} compressed twice before its exchange")
            # The decoded mean is later written back into this buffer (no new allocation).
            self._grads[name] = tensor.detach()
            if self._worker is None and self._can_overlap():
                self._worker = threading.Thread(target=self._worker_main, name="hgc-exchange", daemon=True)
                self._worker.start()
            self._cv.notify_all()
        return torch.ones(1, dtype=torch.float32, device=tensor.device), name

    def decompress(self, output: torch.Tensor, name: str) -> torch.Tensor:
        """The mean over ranks of ``name``'s decoded payloads, scaled as Horovod's op asks."""
        if self._grads:  # the first decompress of the step: every compress is in, flush
            self._finish_step()
        result = self._results.pop(name, None)
        if result is None:
            raise RuntimeError(f"Compression.{self.codec.name}: decompress({name!r}) without compress")
        scale = _placeholder_scale(output)
        return result if scale == 1.0 else result.mul_(scale)

    def exchange(self, grads: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """One whole step without Horovod: ``grads`` (parameter name -> gradient, the same
        names on every rank) -> name -> mean over ranks, each written into its gradient's
        buffer when contiguous. For callers that drive the exchange themselves (the
        double-buffered pipeline); not to be mixed with a step in progress through hooks."""
        if self._grads:
            raise RuntimeError(f"Compression.{self.codec.name}: exchange() during a step in progress through "
                               "compress()")
        unknown = sorted(set(grads) - set(self.index.names))
        if unknown:
            raise KeyError(f"Compression.{self.codec.name}: exchange() got unknown names {unknown[:5]}")
        self._grads = {n: g.detach() for n, g in grads.items()}
        self._finish_step()
        return {n: self._results.pop(n) for n in grads}

    # -- the step -----------------------------------------------------------------
    def _can_overlap(self) -> bool:
        # DGC's clipping needs the whole step's gradient norm: nothing can leave before it.
        return self.overlap and self._plan is not None and not self.memory.needs_all_grads

    def _comm(self) -> MPICommunicator:
        return self.communicator or default_communicator()

    def _finish_step(self) -> None:
        """Run (or let the thread finish) every bucket of the step; then close the step."""
        with self._cv:
            self._flush = True
            self._cv.notify_all()
        try:
            if self.memory.needs_all_grads:
                self.memory.begin_step(self._grads, self._comm().size)
            if self._worker is not None:
                self._worker.join()
                if self._worker_error is not None:
                    raise self._worker_error
            else:
                self._run_buckets()
        finally:
            exchanged = list(self._grads)
            self._worker, self._worker_error, self._flush = None, None, False
            self._grads = {}
        self._close_step(exchanged)

    def _worker_main(self) -> None:
        try:
            self._run_buckets()
        except BaseException as exc:  # re-raised by the main thread in decompress
            self._worker_error = exc

    def _run_buckets(self) -> None:
        """Exchange the plan's buckets in order (each once all its gradients are in, or at the
        flush), then the names outside the plan; without a plan, everything as one bucket."""
        if self._plan is None:
            with self._cv:
                names = sorted(self._grads, key=self.index.order.__getitem__)
            self._exchange_bucket(names, tag="all")
            return
        for j, bucket in enumerate(self._plan.buckets):
            with self._cv:
                self._cv.wait_for(lambda: self._flush or all(n in self._grads for n in bucket))
                names = [n for n in bucket if n in self._grads]
            self._exchange_bucket(names, tag=str(j))
        with self._cv:  # names outside the plan are known only once every compress is in
            self._cv.wait_for(lambda: self._flush)
            extra = sorted((n for n in self._grads if n not in self._plan.names), key=self.index.order.__getitem__)
        self._exchange_bucket(extra, tag="extra")  # on every rank, even when empty: the check finds a mismatch

    def _close_step(self, exchanged: List[str]) -> None:
        t = self._step_totals
        self._stats.record(tensors=t["tensors"], payload=t["payload"], numel=t["numel"], sent=t["sent"], k=t["k"])
        self._step_totals = self._zero_totals()
        self._step += 1
        self.index.end_step()
        self.memory.end_step()
        if self.bucket_bytes is not None and (self._plan is None or set(exchanged) != self._plan.names):
            in_order = sorted(exchanged, key=self._registration.__getitem__, reverse=True)
            params = dict(zip(self.index.names, self.index.params))
            sizes = {n: params[n].numel() * params[n].element_size() for n in in_order}
            self._plan = BucketPlan(in_order, sizes, self.bucket_bytes)

    @staticmethod
    def _zero_totals() -> dict:
        return {"tensors": 0, "payload": 0, "numel": 0, "sent": 0.0, "k": 1}

    # -- one bucket ------------------------------------------------------------------
    def _exchange_bucket(self, names: List[str], tag: str) -> None:
        comm = self._comm()
        grads = {n: self._grads[n] for n in names}
        pattern = self.choose_pattern(grads, comm.size)
        if self.check_agreement:
            with self._timer("exchange_s"):
                comm.check_agreement(f"Compression.{self.codec.name}", [
                    self.codec.agreement_key(), self.memory.agreement_key(), f"bucket {tag} {pattern}"] + [
                    f"{n}:{tuple(g.shape)}:{g.dtype}" for n, g in grads.items()])
            self._step_totals["sent"] += allgather_wire_bytes(AGREEMENT_BYTES, comm.size)
        if not names:
            return
        outs = {n: (g if g.is_contiguous() else None) for n, g in grads.items()}
        if pattern == "two_phase":
            results, info = self._two_phase.exchange(names, grads, self.memory, self._step, len(self.index.names),
                                                     self.index.order, outs)
            payload, sent = info["payload_bytes_phase1"], info["sent_bytes"] + 8 * info["scale_values"]
            for field in ("encode_s", "exchange_s", "decode_s"):
                setattr(self._stats, field, getattr(self._stats, field) + info[field])
        else:
            pending = self._encode_all(comm, names, grads)
            results, info = self._allgather.exchange(comm, names, pending, outs)
            payload, sent = info["payload"], info["sent"]
            self._stats.exchange_s += info["exchange_s"]
            self._stats.decode_s += info["decode_s"]
        with self._cv:
            self._results.update(results)
        t = self._step_totals
        t["tensors"] += len(names)
        t["payload"] += payload
        t["numel"] += sum(g.numel() for g in grads.values())
        t["sent"] += sent
        t["k"] = comm.size

    def choose_pattern(self, grads: Dict[str, torch.Tensor], k: int) -> str:
        """This bucket's pattern (the same on every rank: it depends on shapes and K only)."""
        if self.pattern != "auto":
            return self.pattern
        if self._two_phase is None or k <= 2 or not grads:
            return "allgather"
        entries = [(n, tuple(g.shape), g.dtype) for n, g in grads.items()]
        allgather = (k - 1) * sum(self.codec.payload_nbytes(s, dt) for _, s, dt in entries)
        if allgather < AUTO_MIN_BYTES:
            return "allgather"
        plan = self._two_phase.plan(entries, k)
        return "two_phase" if max(plan.sent_bytes(r) for r in range(k)) < allgather else "allgather"

    def _encode_all(self, comm: MPICommunicator, names: List[str], grads: Dict[str, torch.Tensor]) -> Dict[str, Payload]:
        """Every gradient of the bucket through this rank's memory, each from its own place in
        the random stream (``step * P + sorted index``). Shared-scale codecs (TernGrad) first
        agree on each tensor's scale: the maximum over ranks, all the bucket's scales in one
        MAX-allreduce."""
        options = {n: {} for n in names}
        if self._shared_scale:
            with self._timer("encode_s"):
                local = np.array([self.codec.local_scale(self.memory.compensated(n, grads[n])) for n in names])
            with self._timer("exchange_s"):
                shared = comm.allreduce_max(local)
            self._step_totals["sent"] += allreduce_wire_bytes(8 * len(names), comm.size)
            options = {n: {"scale": float(s)} for n, s in zip(names, shared)}
        pending = {}
        with self._timer("encode_s"):
            for n in names:
                self.codec.reset_stream(self._step * len(self.index.names) + self.index.order[n])
                pending[n] = self.memory.encode(self.codec, n, grads[n], **options[n])
        return pending

    def _timer(self, field: str):
        return _Timer(self._stats, field)

    # -- schedule, introspection and checkpoints ------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Tell the compression the training epoch (DGC's density warm-up by epoch); every
        rank must call it with the same value, before the epoch's first step."""
        if hasattr(self.memory, "set_epoch"):
            self.memory.set_epoch(epoch)

    def stats(self) -> dict:
        """Cumulative counters for this rank (see :mod:`horovod_gradcomp.stats`)."""
        return self._stats.as_dict()

    def state_dict(self) -> dict:
        state = {"codec": repr(self.codec), "memory": repr(self.memory), "feedback": self.memory.state_dict()}
        if self._two_phase is not None:
            state["owner_feedback"] = self._two_phase.owner_feedback.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("codec") != repr(self.codec):
            raise ValueError(f"checkpoint was written by {state.get('codec')}, this compression is {self.codec!r}")
        if "memory" in state and state["memory"] != repr(self.memory):
            raise ValueError(f"checkpoint was written with {state['memory']}, this compression has {self.memory!r}")
        self.memory.load_state_dict(state["feedback"])
        if self._two_phase is not None and "owner_feedback" in state:
            self._two_phase.owner_feedback.load_state_dict(state["owner_feedback"])

    def __repr__(self) -> str:
        return (f"CodecCompression({self.codec!r}, memory={self.memory!r}, pattern={self.pattern!r}, "
                f"bucket_bytes={self.bucket_bytes}, overlap={self.overlap})")


class _Timer:
    def __init__(self, stats: ExchangeStats, field: str):
        self.stats, self.field = stats, field

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        setattr(self.stats, self.field, getattr(self.stats, self.field) + time.perf_counter() - self.t0)
