"""The factories passed as ``compression=`` to stock ``hvd.DistributedOptimizer``.

``Compression.none()`` / ``fp16()``: Horovod's own allreduce (:class:`DenseCompression`),
with the same ``stats()``. Every codec: a :class:`~horovod_gradcomp.codec_compression.CodecCompression`
(see that module for how a step is exchanged).

Interactions with DistributedOptimizer's other options:
* ``backward_passes_per_step=N``: Horovod accumulates N backward passes locally and calls
  ``compress`` once on the sum; nothing special here.
* ``op=hvd.Average`` gives the mean, ``op=hvd.Sum`` the sum; ``gradient_predivide_factor``
  cancels out as it does for dense gradients.
* ``op=hvd.Adasum`` is not linear and is not supported; ``sparse_as_dense`` / sparse
  gradients are not supported (a clear error is raised); ``groups`` works (grouped
  allreduce of placeholders); ``process_set``: pass the same set to the factory
  (``process_set=``), whose exchange then runs on the set's ranks through Horovod.
"""
from __future__ import annotations

import inspect
import itertools
import threading
from typing import Iterable, Optional, Tuple

import torch

from .codec_compression import CodecCompression
from .codecs import get_codec
from .codecs.registry import codec_class
from .comm import MPICommunicator
from .dgc_memory import DensitySchedule, DGCMemory
from .optimizer_check import PlainSGDGuard
from .stats import ExchangeStats, allreduce_wire_bytes
from .transports import select_communicator

__all__ = ["CodecCompression", "Compression", "DenseCompression"]

NamedParameters = Iterable[Tuple[str, torch.nn.Parameter]]


class DenseCompression:
    """Horovod's own allreduce of the gradient, optionally cast to a wire dtype (fp16),
    with the same ``stats()`` as the codecs so that results compare on one API."""

    _instances = itertools.count()

    def __init__(self, wire_dtype: Optional[torch.dtype] = None):
        self.wire_dtype = wire_dtype
        # exchange() names its collectives "hgc.dense.<object>.<call>": Horovod's automatic
        # names number *every* Horovod op of the process, so any op issued from another
        # thread (a barrier, a pipeline's exchange thread) would shift them differently
        # on each rank and the ranks would wait for different names (a deadlock).
        self._object_id = next(DenseCompression._instances)
        self._exchanges = itertools.count()
        self._exchange_lock = threading.Lock()
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

    def exchange(self, grads: dict) -> dict:
        """One whole step without the optimizer's hooks: name -> mean over ranks of
        ``grads[name]`` through Horovod's allreduce (in the wire dtype), every name in one
        grouped allreduce (same names on every rank)."""
        import horovod.torch as hvd
        names = sorted(grads)
        with self._exchange_lock:
            call = f"hgc.dense.{self._object_id}.{next(self._exchanges)}"
            sent = [self.compress(grads[n]) for n in names]
            outs = hvd.grouped_allreduce([t for t, _ in sent], op=hvd.Average, name=call)
            return {n: self.decompress(o, ctx) for n, o, (_, ctx) in zip(names, outs, sent)}

    def stats(self) -> dict:
        return self._stats.as_dict()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


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
              pattern: str = "allgather", bucket_bytes: Optional[int] = None, overlap: bool = True,
              communicator: Optional[MPICommunicator] = None, check_agreement: bool = True,
              transport: str = "auto", process_set=None, **codec_options) -> CodecCompression:
        """Any registered codec (see ``hgc.available_codecs()``) behind the same adapter.

        ``pattern``: "allgather" (every payload to every rank: (K-1) payloads sent per rank),
        "two_phase" (owner-of-1/K with requantization: about 2 payloads per rank whatever K;
        fixed-size codecs only) or "auto". ``bucket_bytes``: exchange in buckets of about
        this many gradient bytes, from a communication thread during backward when
        ``overlap`` (None: one exchange per step at ``synchronize()``).

        ``transport`` ("auto" | "mpi" | "horovod") and ``process_set``: where the payloads
        travel, when no ``communicator`` is given (rule in :mod:`horovod_gradcomp.transports.select`:
        Horovod's collectives on Gloo or a process set, else mpi4py).

        Stochastic codecs (those taking ``rank_stream``) get this rank's number unless told
        otherwise, so each rank draws its own random stream."""
        if communicator is None:
            communicator = select_communicator(transport, process_set, owner=f"Compression.{name}")
        elif transport != "auto" or process_set is not None:
            raise ValueError(f"Compression.{name}: pass either communicator= or transport=/process_set=, not both")
        if "rank_stream" in inspect.signature(codec_class(name)).parameters and "rank_stream" not in codec_options:
            codec_options["rank_stream"] = communicator.rank
        return CodecCompression(get_codec(name, **codec_options), named_parameters, error_feedback=error_feedback,
                                memory=memory, pattern=pattern, bucket_bytes=bucket_bytes, overlap=overlap,
                                communicator=communicator, check_agreement=check_agreement)

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
