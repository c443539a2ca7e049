"""The factories passed as ``compression=`` to stock ``hvd.DistributedOptimizer``.

``Compression.none()`` / ``fp16()``: Horovod's own allreduce
(:class:`~horovod_gradcomp.hvd_adapter.dense.DenseCompression`), with the same ``stats()``. Every
codec: a :class:`~horovod_gradcomp.hvd_adapter.compression.CodecCompression` (see that module for
how a step is exchanged).

Interactions with DistributedOptimizer's other options:
* ``backward_passes_per_step=N``: Horovod accumulates N backward passes locally and calls
  ``compress`` once on the sum; nothing special here.
* ``op=hvd.Average`` gives the mean, ``op=hvd.Sum`` the sum; ``gradient_predivide_factor``
  cancels out as it does for dense gradients.
* ``op=hvd.Adasum`` is refused at the first ``compress`` with an
  :class:`~horovod_gradcomp.hvd_adapter.options_check.UnsupportedHorovodOption`; ``groups`` works
  (grouped allreduce of placeholders).
* sparse gradients: with ``sparse_as_dense=False`` Horovod allgathers them itself and the
  compression returns them untouched; with ``sparse_as_dense=True`` their dense copy is
  compressed like any gradient.
* ``process_set``: pass the same set to the factory (``process_set=``, every factory takes
  it), whose exchange then runs on the set's ranks through Horovod; on ranks outside the set
  the compression is inert, as the optimizer is (a set the optimizer uses but the factory
  was not given is refused).
"""
from __future__ import annotations

import inspect
from typing import Iterable, Optional, Tuple

import torch

from ..codecs import get_codec
from ..codecs.registry import codec_class
from ..transports.mpi import MPICommunicator
from ..exchange.pipeline import DEFAULT_CHUNK_BYTES
from ..state.dgc_memory import DensitySchedule, DGCMemory
from ..codecs.dgc import DGCCodec, density_floor
from ..flags import require_flag
from .adam_defaults import apply_adam_defaults
from .compression import CodecCompression
from .dense import DenseCompression
from .optimizer_check import PlainSGDGuard
from ..transports import select_communicator

__all__ = ["CodecCompression", "Compression", "DenseCompression"]

NamedParameters = Iterable[Tuple[str, torch.nn.Parameter]]


class Compression:
    """Factories for ``hvd.DistributedOptimizer(..., compression=...)``."""

    @staticmethod
    def none(named_parameters: Optional[NamedParameters] = None, *, transport: str = "auto", process_set=None,
             timeout: Optional[float] = None) -> DenseCompression:
        """Horovod's plain fp32 allreduce, with stats. ``process_set``: the set the optimizer
        reduces over (its ranks are counted in ``stats()``; inert outside it). ``transport`` is
        checked as the codecs' is; the allreduce is Horovod's own whatever it says."""
        return Compression._dense(None, "none", transport, process_set, timeout)

    @staticmethod
    def fp16(named_parameters: Optional[NamedParameters] = None, *, transport: str = "auto", process_set=None,
             timeout: Optional[float] = None) -> DenseCompression:
        """Horovod's allreduce in fp16, with stats (options as :meth:`none`)."""
        return Compression._dense(torch.float16, "fp16", transport, process_set, timeout)

    @staticmethod
    def _dense(wire_dtype, name: str, transport: str, process_set, timeout) -> DenseCompression:
        select_communicator(transport, process_set, owner=f"Compression.{name}")  # the same checks as the codecs
        return DenseCompression(wire_dtype, process_set=process_set, timeout=timeout)

    @staticmethod
    def codec(name: str, named_parameters: NamedParameters, *, error_feedback: Optional[bool] = None, memory=None,
              pattern: Optional[str] = None, bucket_bytes: Optional[int] = None, overlap: bool = True,
              communicator: Optional[MPICommunicator] = None, check_agreement: bool = True,
              timeout: Optional[float] = None, transport: str = "auto", process_set=None,
              pipeline_bytes: Optional[int] = DEFAULT_CHUNK_BYTES, ranks_per_node: Optional[int] = None,
              inner_pattern: str = "auto", optimizer: Optional[torch.optim.Optimizer] = None,
              **codec_options) -> CodecCompression:
        """Any registered codec (see ``hgc.available_codecs()``) behind the same adapter.

        ``pattern``: "allgather" (every payload to every rank: (K-1) payloads sent per rank),
        "two_phase" (owner-of-1/K with requantization: about 2 payloads per rank whatever K;
        fixed-size codecs only) or "auto" (per bucket, whichever of the two sends fewer bytes per
        rank; allgather for K <= 2, variable-size codecs and small buckets; see
        :meth:`~horovod_gradcomp.exchange.engine.StepEngine.choose_pattern`). None (the
        default): the codec's ``default_pattern``: "auto" for onebit, qsgd and terngrad,
        "allgather" for dgc (why, measured at K=4: the guide's "Exchange, buckets, pipelining" page,
        docs/guide/exchange.md).
        Two-phase quantizes each mean a second time on its owner (with the owner's own error
        feedback when ``error_feedback`` is on), except TernGrad's, whose owners send the exact
        sum. ``bucket_bytes``: exchange in buckets of about
        this many gradient bytes, from a communication thread during backward when
        ``overlap`` (None: one exchange per step at ``synchronize()``). ``pipeline_bytes``: a
        bucket of fixed-size payloads larger than this many payload bytes is sent in chunks of
        at least that size (at most 8 per bucket), each chunk's collectives (the allgather, or
        two-phase's alltoallv and allgatherv) on a communication thread while the next chunk is
        encoded and the previous one decoded (None or 0: the bucket at once; the bytes sent and
        the results are the same either way).

        ``pattern="hierarchical"``: dense inside each node, the codec between nodes, every local
        rank owning 1/L of each bucket (guide: "Multi-GPU nodes"); ``inner_pattern`` ("auto",
        "allgather" or "two_phase") is the codec's pattern between nodes. ``ranks_per_node``: L,
        overriding what the launcher says (None: ``HOROVOD_GRADCOMP_RANKS_PER_NODE``, else MPI's
        shared-memory split). ``"auto"`` picks hierarchical when there are several nodes of several
        ranks each, all of one size.

        ``timeout``: seconds any bucket may wait for the other ranks before the MPI job is
        aborted with an error naming the step and bucket (None: ``HOROVOD_GRADCOMP_STALL_TIMEOUT``
        or 300; 0: no deadline). ``check_agreement``: compare what the ranks exchange before
        each bucket (in the preamble collective, which runs anyway to share non-finite flags).

        ``error_feedback``: keep a residual per parameter (None: the codec's own default,
        ``error_feedback_default``: on for onebit, off for terngrad and qsgd, so that
        ``Compression.codec("terngrad", ...)`` and ``Compression.terngrad(...)`` agree). Likewise
        the codec's ``adapter_defaults`` replace the constructor's defaults of the options not
        given (QSGD: ``norm="max"``, as ``Compression.qsgd``).

        ``transport`` ("auto" | "mpi" | "horovod") and ``process_set``: where the payloads
        travel, when no ``communicator`` is given (rule in :mod:`horovod_gradcomp.transports.select`:
        Horovod's collectives on Gloo or a process set, else mpi4py).

        Stochastic codecs (those taking ``rank_stream``) get this rank's number unless told
        otherwise, so each rank draws its own random stream.

        ``optimizer``: the optimizer that steps these parameters, when the caller knows it
        (the DDP hook, Lightning, Accelerate). Under the Adam family (Adam, AdamW, NAdam, RAdam,
        Adamax) the codec's ``adam_defaults``, under ``torch.optim.SGD`` its ``sgd_defaults``,
        replace the options not given here (:mod:`~horovod_gradcomp.hvd_adapter.adam_defaults`);
        under Horovod the ``DistributedOptimizer`` is found at the first ``compress`` without it."""
        explicit = frozenset(codec_options)
        codec_options = {**codec_class(name).adapter_defaults, **codec_options}
        if error_feedback is None:
            error_feedback = codec_class(name).error_feedback_default
        require_flag(f"Compression.{name}", "error_feedback", error_feedback)
        if communicator is None:
            communicator = select_communicator(transport, process_set, owner=f"Compression.{name}")
        elif transport != "auto" or process_set is not None:
            raise ValueError(f"Compression.{name}: pass either communicator= or transport=/process_set=, not both")
        if "rank_stream" in inspect.signature(codec_class(name)).parameters and "rank_stream" not in codec_options:
            codec_options["rank_stream"] = communicator.rank
        comp = CodecCompression(get_codec(name, **codec_options), named_parameters, error_feedback=error_feedback,
                                memory=memory, pattern=pattern, bucket_bytes=bucket_bytes, overlap=overlap,
                                communicator=communicator, check_agreement=check_agreement, timeout=timeout,
                                pipeline_bytes=pipeline_bytes, ranks_per_node=ranks_per_node,
                                inner_pattern=inner_pattern)
        comp.explicit_options = explicit
        apply_adam_defaults(comp, optimizer)
        return comp

    @staticmethod
    def onebit(named_parameters: NamedParameters, *, error_feedback: Optional[bool] = None, impl: str = "native",
               **options) -> CodecCompression:
        """1-bit SGD (Seide et al.) with error feedback: sign bits and two reconstruction values
        per row of each gradient (``scales="rows"``, the default) or per column (``scales="columns"``,
        the paper's grouping). Codec options (``scales``, ``warmup_steps``, ``lr_warmup_steps``,
        ``residual_cap``; ``ramp_steps`` is the deprecated name of ``lr_warmup_steps``): see
        :class:`~horovod_gradcomp.codecs.onebit.OneBitCodec`; the exchange options: :meth:`codec`."""
        return Compression.codec("onebit", named_parameters, error_feedback=error_feedback, impl=impl, **options)

    @staticmethod
    def terngrad(named_parameters: NamedParameters, *, error_feedback: Optional[bool] = None, impl: str = "native",
                 **options) -> CodecCompression:
        """TernGrad (Wen et al.): a scale shared by all ranks (one MAX-allreduce for all tensors per
        step), stochastic ternary values, 2 bits each. Codec options (``seed``, ``clip``: c in
        c*sigma, ``warmup_steps``): see :class:`~horovod_gradcomp.codecs.terngrad.TernGradCodec`;
        the exchange options: :meth:`codec`."""
        return Compression.codec("terngrad", named_parameters, error_feedback=error_feedback, impl=impl, **options)

    @staticmethod
    def qsgd(named_parameters: NamedParameters, *, error_feedback: Optional[bool] = None, impl: str = "native",
             norm: str = "max", **options) -> CodecCompression:
        """QSGD (Alistarh et al.): s-level stochastic quantization per bucket. Codec options
        (``bits`` or ``levels``, ``bucket``, ``norm``, ``coding``: "fixed" | "elias", ``seed``): see
        :class:`~horovod_gradcomp.codecs.qsgd.QSGDCodec`; the exchange options: :meth:`codec`.

        ``norm`` defaults to "max" (the paper's practical variant), here and in
        ``Compression.codec("qsgd", ...)`` (the codec's ``adapter_defaults``): with few levels the
        2-norm's variance (up to sqrt(d)/s times ||v||^2 per bucket of d values) is several
        times the gradient itself, and the demo's model diverges with 4 bits and "l2". The bare
        codec, ``hgc.get_codec("qsgd")``, keeps the paper's analysed "l2"."""
        return Compression.codec("qsgd", named_parameters, error_feedback=error_feedback, impl=impl, norm=norm,
                                 **options)

    @staticmethod
    def dgc(named_parameters: NamedParameters, *, density: Optional[float] = None, momentum: Optional[float] = None,
            nesterov: Optional[bool] = None, momentum_masking: bool = True, clip_norm: Optional[float] = None,
            warmup_start: float = 0.25, warmup_length: int = 0, warmup_unit: str = "step",
            check_optimizer: bool = True, impl: str = "native", communicator: Optional[MPICommunicator] = None,
            check_agreement: bool = True, timeout: Optional[float] = None,
            optimizer: Optional[torch.optim.Optimizer] = None, **options) -> CodecCompression:
        """Deep Gradient Compression (Lin et al.): top-``density`` sparsification of the
        momentum-corrected accumulated velocity (see :mod:`horovod_gradcomp.state.dgc_memory`).

        The momentum lives in the compression. ``momentum=None`` (the default) takes it from the
        wrapped optimizer before its first step: a ``torch.optim.SGD(momentum=m, nesterov=b)``
        hands ``m`` and ``b`` to the compression and keeps none itself (its param groups are set
        to momentum 0, with one log line), so a plain-SGD script stays plain SGD and a
        momentum-SGD script gets DGC's momentum correction without edits. Any other optimizer
        (Adam, AdamW, ...) works too: DGC then runs without its momentum correction (momentum 0;
        one warning per process says so) and the optimizer applies its own moments. An explicit
        ``momentum=`` requires the wrapped SGD to have momentum 0, and an explicit momentum > 0 is
        refused with a non-SGD optimizer (checked before its first step unless
        ``check_optimizer=False``). ``clip_norm``: the gradient-norm threshold C
        that clipping the reduced gradient would use; each rank clips its own gradient to
        ``C * sqrt(K)`` under Horovod's default ``op=hvd.Average`` and to ``C / sqrt(K)`` (the
        paper's rule for summed gradients) under ``op=hvd.Sum``. Warm-up:
        ``warmup_length`` steps (or epochs with ``warmup_unit="epoch"``, then call
        ``compression.set_epoch(epoch)`` at the start of each epoch) during which the density
        falls exponentially from ``warmup_start`` to ``density``. Codec options: ``sample``
        (fraction of values sampled for the threshold estimate), ``seed``.

        ``density``: None (the default) is 0.001, the paper's, under SGD and 0.1 under the Adam
        family (``DGCCodec.adam_defaults``; ``optimizer=`` as :meth:`codec`), and in both cases at
        least enough for 1,024 values per rank and step (``codecs.dgc.density_floor`` of the
        trainable parameters' count: a model under about a million parameters sends more than
        0.001 of its gradient). A density given is used as given."""
        named = list(named_parameters)
        given = {"density"} if density is not None else set()
        density = DGCCodec.DEFAULT_DENSITY if density is None else density
        schedule = DensitySchedule(density, start=warmup_start, length=warmup_length, unit=warmup_unit)
        adopt = momentum is None
        require_flag("Compression.dgc", "check_optimizer", check_optimizer)
        if adopt and not check_optimizer:
            raise ValueError("Compression.dgc: momentum=None takes the momentum from the wrapped optimizer, which "
                             "needs check_optimizer=True; pass momentum= explicitly with check_optimizer=False")
        memory = DGCMemory(schedule, momentum=0.0 if adopt else momentum,
                           nesterov=False if nesterov is None else nesterov, momentum_masking=momentum_masking,
                           clip_norm=clip_norm, momentum_from_optimizer=adopt, density_given=bool(given))
        memory.set_density_floor(density_floor(sum(p.numel() for _, p in named if p.requires_grad)))
        comp = Compression.codec("dgc", named, impl=impl, density=density, communicator=communicator,
                                 check_agreement=check_agreement, timeout=timeout, memory=memory, **options)
        comp.explicit_options = frozenset(options) | given
        apply_adam_defaults(comp, optimizer)
        if check_optimizer:
            comp.optimizer_guard = PlainSGDGuard([p for _, p in named], owner="Compression.dgc",
                                                 adopt_momentum=memory.adopt_momentum if adopt else None,
                                                 momentum=0.0 if adopt else float(momentum))
        return comp
