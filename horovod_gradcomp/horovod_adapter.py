"""Objects passed as ``compression=`` to stock ``hvd.DistributedOptimizer``.

Horovod calls ``compress(p.grad)`` from each gradient hook, allreduces what it returns,
and in ``synchronize()`` (run by ``step()``) calls ``decompress(output, ctx)`` and makes
the result ``p.grad``. A packed payload cannot be summed, so :class:`CodecCompression`:

1. ``compress``: finds the parameter's name, encodes (with error feedback) and keeps the
   payload; returns to Horovod a one-element float32 placeholder holding 1.0.
2. the first ``decompress`` of a step: every parameter of the step has been compressed by
   then (Horovod submits the missing ones first), so it fuses all payloads, in sorted-name
   order (never hook order, which differs between ranks), allgathers them over its own
   MPI communicator and decodes the mean of the K payloads of each tensor.
3. each ``decompress`` returns its tensor's result times the reduced placeholder: 1 for
   ``op=hvd.Average`` (the mean), K for ``op=hvd.Sum``; ``gradient_predivide_factor``
   cancels out as it does for dense gradients.

Interactions with DistributedOptimizer's other options:
* ``backward_passes_per_step=N``: Horovod accumulates N backward passes locally and calls
  ``compress`` once on the sum; nothing special here.
* ``op=hvd.Adasum`` is not linear and is not supported; ``sparse_as_dense`` / sparse
  gradients are not supported (a clear error is raised); ``groups`` works (grouped
  allreduce of placeholders); ``process_set`` other than the global one is not supported
  (the exchange runs over all of COMM_WORLD).
"""
from __future__ import annotations

import inspect
import threading
import time
from typing import Dict, Iterable, Optional, Tuple

import numpy as np
import torch

from .codecs import get_codec
from .codecs.registry import codec_class
from .codecs.base import Codec, Payload
from .comm import MPICommunicator, default_communicator
from .dgc_memory import DensitySchedule, DGCMemory
from .feedback import ErrorFeedback
from .optimizer_check import PlainSGDGuard
from .fusion import FusedLayout, pack_variable, unpack_variable
from .param_index import ParamIndex
from .stats import ExchangeStats, allgather_wire_bytes, allreduce_wire_bytes

NamedParameters = Iterable[Tuple[str, torch.nn.Parameter]]


class _Timer:
    def __init__(self, stats: ExchangeStats, field: str):
        self.stats, self.field = stats, field

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        setattr(self.stats, self.field, getattr(self.stats, self.field) + time.perf_counter() - self.t0)


def _placeholder_scale(output: torch.Tensor) -> float:
    """What Horovod's reduction made of the placeholder 1.0 (1 for Average, K for Sum)."""
    return float(output.reshape(-1)[0])


class DenseCompression:
    """Horovod's own allreduce of the gradient, optionally cast to a wire dtype (fp16),
    with the same ``stats()`` as the codecs so that results compare on one API."""

    def __init__(self, wire_dtype: Optional[torch.dtype] = None):
        self.wire_dtype = wire_dtype
        self._stats = ExchangeStats()
        self._step_open = False
        self._step_numel = self._step_bytes = self._step_tensors = 0

    def compress(self, tensor: torch.Tensor):
        sent = tensor
        if self.wire_dtype is not None and tensor.dtype.is_floating_point:
            sent = tensor.to(self.wire_dtype)
        self._step_open = True
        self._step_numel += tensor.numel()
        self._step_bytes += sent.numel() * sent.element_size()
        self._step_tensors += 1
        return sent, tensor.dtype

    def decompress(self, tensor: torch.Tensor, ctx):
        if self._step_open:
            import horovod.torch as hvd
            k = hvd.size()
            self._stats.record(tensors=self._step_tensors, payload=self._step_bytes, numel=self._step_numel,
                               sent=allreduce_wire_bytes(self._step_bytes, k), k=k)
            self._step_open = False
            self._step_numel = self._step_bytes = self._step_tensors = 0
        return tensor if tensor.dtype == ctx else tensor.to(ctx)

    def stats(self) -> dict:
        return self._stats.as_dict()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class CodecCompression:
    """Compressed exchange of every named parameter's gradient with one codec.

    Fields:
        codec: the :class:`~horovod_gradcomp.codecs.base.Codec` encoding each gradient.
        memory: the per-rank state between steps: :class:`~horovod_gradcomp.feedback.ErrorFeedback`
            residuals by name (``feedback`` is the same object), or DGC's momentum and
            accumulation (:class:`~horovod_gradcomp.dgc_memory.DGCMemory`).
        communicator: where payloads travel (a duplicate of COMM_WORLD by default).
        check_agreement: before each exchange, verify (one 16-byte allgather) that all
            ranks exchange the same tensors; a mismatch raises on every rank instead of
            hanging or mixing buffers.
    """

    def __init__(self, codec: Codec, named_parameters: NamedParameters, *, error_feedback: bool = True,
                 memory=None, communicator: Optional[MPICommunicator] = None, check_agreement: bool = True):
        self.codec = codec
        self.index = ParamIndex(named_parameters, owner=f"Compression.{codec.name}")
        self.memory = memory if memory is not None else ErrorFeedback(enabled=error_feedback)
        self.feedback = self.memory
        self.communicator = communicator
        self.check_agreement = check_agreement
        self._stats = ExchangeStats()
        self._pending: Dict[str, Payload] = {}
        self._results: Dict[str, torch.Tensor] = {}
        self._grads: Dict[str, torch.Tensor] = {}
        # Codecs whose scale is agreed across ranks (TernGrad), and memories that need the whole
        # step's gradient (DGC's clipping), encode at exchange time instead of in the hooks.
        self._shared_scale = bool(getattr(codec, "shared_scale", False))
        self._deferred = self._shared_scale or self.memory.needs_all_grads
        self._layouts: Dict[tuple, FusedLayout] = {}
        self._lock = threading.Lock()

    # -- Horovod's Compressor interface -------------------------------------------
    def compress(self, tensor: torch.Tensor):
        """Encode ``tensor`` (a parameter's ``.grad``); return the placeholder and its name."""
        with self._lock:
            name = self.index.name_of(tensor)
            if name in self._grads:
                raise RuntimeError(f"Compression.{self.codec.name}: {name!r} compressed twice before its exchange")
            if not self._deferred:
                with _Timer(self._stats, "encode_s"):
                    self._encode(name, tensor.detach())
            # Once encoded, the gradient's values are no longer needed (the residual keeps the
            # error): the decoded mean is written back into it, sparing a new allocation.
            self._grads[name] = tensor.detach()
        return torch.ones(1, dtype=torch.float32, device=tensor.device), name

    def decompress(self, output: torch.Tensor, name: str) -> torch.Tensor:
        """The mean over ranks of ``name``'s decoded payloads, scaled as Horovod's op asks."""
        with self._lock:
            if name not in self._results:
                if name not in self._grads:
                    raise RuntimeError(f"Compression.{self.codec.name}: decompress({name!r}) without compress")
                self._exchange()
            result = self._results.pop(name)
        scale = _placeholder_scale(output)
        return result if scale == 1.0 else result.mul_(scale)

    # -- the exchange -------------------------------------------------------------
    def _layout(self, names) -> FusedLayout:
        entries = tuple((n, tuple(self._pending[n].shape), self._pending[n].dtype) for n in names)
        layout = self._layouts.get(entries)
        if layout is None:
            layout = self._layouts[entries] = FusedLayout(self.codec, entries)
        return layout

    def _encode(self, name: str, grad: torch.Tensor, **options) -> None:
        """Encode one gradient (with error feedback) from its own place in the random stream."""
        self.codec.reset_stream(self._stats.steps * len(self.index.names) + self.index.order[name])
        self._pending[name] = self.memory.encode(self.codec, name, grad, **options)

    def _encode_with_shared_scales(self, comm: MPICommunicator, names) -> None:
        """Encode every gradient with the scale agreed by all ranks: the maximum over ranks of
        each tensor's local scale, all tensors' scales in one MAX-allreduce."""
        with _Timer(self._stats, "encode_s"):
            local = np.array([self.codec.local_scale(self.memory.compensated(n, self._grads[n])) for n in names])
        with _Timer(self._stats, "exchange_s"):
            shared = comm.allreduce_max(local)
        with _Timer(self._stats, "encode_s"):
            for n, s in zip(names, shared):
                self._encode(n, self._grads[n], scale=float(s))

    def _exchange(self) -> None:
        comm = self.communicator or default_communicator()
        names = sorted(self._grads, key=self.index.order.__getitem__)
        if self.check_agreement:
            with _Timer(self._stats, "exchange_s"):
                comm.check_agreement(f"Compression.{self.codec.name}", [
                    self.codec.agreement_key(), self.memory.agreement_key()] + [
                    f"{n}:{tuple(self._grads[n].shape)}:{self._grads[n].dtype}" for n in names])
        if self._deferred:
            self.memory.begin_step(self._grads, comm.size)
            if self._shared_scale:
                self._encode_with_shared_scales(comm, names)
            else:
                with _Timer(self._stats, "encode_s"):
                    for n in names:
                        self._encode(n, self._grads[n])
        if getattr(self.codec, "variable_size", False):
            self._exchange_variable(comm, names)
        else:
            self._exchange_fixed(comm, names)
        self._pending.clear()
        self._grads.clear()
        self.index.end_step()
        self.memory.end_step()

    def _out_for(self, name: str):
        grad = self._grads[name]
        return grad if grad.is_contiguous() else None

    def _exchange_variable(self, comm: MPICommunicator, names) -> None:
        """Payload sizes differ between ranks and steps: allgather of sizes, then allgatherv."""
        with _Timer(self._stats, "exchange_s"):
            send = pack_variable(names, self._pending)
            parts = comm.allgatherv(send)
        k = len(parts)
        with _Timer(self._stats, "decode_s"):
            decoded = [unpack_variable(part, names, self._pending) for part in parts]
            for n in names:
                self._results[n] = self.codec.decode_many([d[n] for d in decoded], out=self._out_for(n))
        numel = sum(self._pending[n].numel for n in names)
        sent = allgather_wire_bytes(send.numel() + 8 + (16 if self.check_agreement else 0), k)
        self._stats.record(tensors=len(names), payload=send.numel(), numel=numel, sent=sent, k=k)

    def _exchange_fixed(self, comm: MPICommunicator, names) -> None:
        layout = self._layout(names)
        with _Timer(self._stats, "exchange_s"):
            recv = comm.allgather(layout.pack(self._pending))
        k = recv.shape[0]
        devices = {n: p.device for n, p in self._pending.items()}
        with _Timer(self._stats, "decode_s"):
            for name, stacked in layout.unpack(recv, devices):
                self._results[name] = self.codec.decode_mean(stacked, out=self._out_for(name))
        numel = sum(p.numel for p in self._pending.values())
        sent = allgather_wire_bytes(layout.nbytes + (16 if self.check_agreement else 0), k)
        self._stats.record(tensors=len(names), payload=layout.nbytes, numel=numel, sent=sent, k=k)

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
        return {"codec": repr(self.codec), "memory": repr(self.memory), "feedback": self.memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("codec") != repr(self.codec):
            raise ValueError(f"checkpoint was written by {state.get('codec')}, this compression is {self.codec!r}")
        if "memory" in state and state["memory"] != repr(self.memory):
            raise ValueError(f"checkpoint was written with {state['memory']}, this compression has {self.memory!r}")
        self.memory.load_state_dict(state["feedback"])

    def __repr__(self) -> str:
        return f"CodecCompression({self.codec!r}, memory={self.memory!r})"


class Compression:
    """Factories for ``hvd.DistributedOptimizer(..., compression=...)``."""

    @staticmethod
    def none(named_parameters: Optional[NamedParameters] = None) -> DenseCompression:
        """Horovod's plain fp32 allreduce, with stats."""
        return DenseCompression(None)

    @staticmethod
    def fp16(named_parameters: Optional[NamedParameters] = None) -> DenseCompression:
        """Horovod's allreduce in fp16, with stats."""
        return DenseCompression(torch.float16)

    @staticmethod
    def codec(name: str, named_parameters: NamedParameters, *, error_feedback: bool = True, memory=None,
              communicator: Optional[MPICommunicator] = None, check_agreement: bool = True,
              **codec_options) -> CodecCompression:
        """Any registered codec (see ``hgc.available_codecs()``) behind the same adapter.

        Stochastic codecs (those taking ``rank_stream``) get this rank's number unless told
        otherwise, so each rank draws its own random stream."""
        if "rank_stream" in inspect.signature(codec_class(name)).parameters and "rank_stream" not in codec_options:
            codec_options["rank_stream"] = (communicator or default_communicator()).rank
        return CodecCompression(get_codec(name, **codec_options), named_parameters, error_feedback=error_feedback,
                                memory=memory, communicator=communicator, check_agreement=check_agreement)

    @staticmethod
    def onebit(named_parameters: NamedParameters, *, error_feedback: bool = True, impl: str = "native",
               **options) -> CodecCompression:
        """1-bit SGD with per-column reconstruction values and error feedback (Seide et al.)."""
        return Compression.codec("onebit", named_parameters, error_feedback=error_feedback, impl=impl, **options)

    @staticmethod
    def terngrad(named_parameters: NamedParameters, *, error_feedback: bool = False, impl: str = "native",
                 **options) -> CodecCompression:
        """TernGrad (Wen et al.): a scale shared by all ranks (one MAX-allreduce for all tensors per
        step), stochastic ternary values, 2 bits each. Options: seed, clip (c in c*sigma)."""
        return Compression.codec("terngrad", named_parameters, error_feedback=error_feedback, impl=impl, **options)

    @staticmethod
    def qsgd(named_parameters: NamedParameters, *, error_feedback: bool = False, impl: str = "native",
             norm: str = "max", **options) -> CodecCompression:
        """QSGD (Alistarh et al.): s-level stochastic quantization per bucket. Options: bits or
        levels, bucket, norm, coding ("fixed" | "elias"), seed.

        ``norm`` defaults to "max" here (the paper's practical variant): with few levels the
        2-norm's variance (up to sqrt(d)/s times ||v||^2 per bucket of d values) is several
        times the gradient itself, and the demo's model diverges with 4 bits and "l2"."""
        return Compression.codec("qsgd", named_parameters, error_feedback=error_feedback, impl=impl, norm=norm,
                                 **options)

    @staticmethod
    def dgc(named_parameters: NamedParameters, *, density: float = 0.001, momentum: float = 0.9,
            nesterov: bool = False, momentum_masking: bool = True, clip_norm: Optional[float] = None,
            warmup_start: float = 0.25, warmup_length: int = 0, warmup_unit: str = "epoch",
            check_optimizer: bool = True, impl: str = "native", communicator: Optional[MPICommunicator] = None,
            check_agreement: bool = True, **options) -> CodecCompression:
        """Deep Gradient Compression (Lin et al.): top-``density`` sparsification of the
        momentum-corrected accumulated velocity (see :mod:`horovod_gradcomp.dgc_memory`).

        The momentum lives here: wrap a ``torch.optim.SGD`` with **momentum=0** (checked before
        its first step unless ``check_optimizer=False``). ``clip_norm``: the single-worker
        gradient-norm threshold; each rank clips its gradient to ``clip_norm / sqrt(K)``.
        Warm-up: ``warmup_length`` epochs (or steps, ``warmup_unit="step"``) during which the
        density falls exponentially from ``warmup_start`` to ``density``; by epoch, call
        ``compression.set_epoch(epoch)`` at the start of each epoch. Codec options:
        ``sample`` (fraction of values sampled for the threshold estimate), ``seed``."""
        named = list(named_parameters)
        schedule = DensitySchedule(density, start=warmup_start, length=warmup_length, unit=warmup_unit)
        memory = DGCMemory(schedule, momentum=momentum, nesterov=nesterov, momentum_masking=momentum_masking,
                           clip_norm=clip_norm)
        comp = Compression.codec("dgc", named, impl=impl, density=density, communicator=communicator,
                                 check_agreement=check_agreement, memory=memory, **options)
        if check_optimizer:
            comp.optimizer_guard = PlainSGDGuard([p for _, p in named], owner="Compression.dgc")
        return comp
