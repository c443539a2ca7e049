"""The ``compression=`` object of every codec: Horovod's hooks in, results back to Horovod.

Horovod calls ``compress(p.grad)`` from each gradient hook, allreduces what it returns, and
in ``synchronize()`` (run by ``step()``) calls ``decompress(output, ctx)`` for every
parameter, after every ``compress`` of the step (it submits the missing ones first). A
packed payload cannot be summed by Horovod, so:

1. ``compress`` does not encode: it finds the gradient's parameter name, hands the gradient
   to the step engine (:mod:`horovod_gradcomp.exchange.engine`, which may already exchange
   complete buckets from its communication thread) and returns a one-element float32
   placeholder holding 1.0 for Horovod to allreduce.
2. The first ``decompress`` of the step flushes the engine: every remaining bucket is
   encoded (error feedback or DGC state), exchanged and decoded.
3. Each ``decompress`` returns its tensor's mean over ranks times the reduced placeholder:
   1 for ``op=hvd.Average``, K for ``op=hvd.Sum``.

Sparse gradients: with ``sparse_as_dense=False`` Horovod allgathers them itself, never calls
``compress`` for them and then calls ``decompress(x, None)``, which returns ``x`` untouched.
With ``sparse_as_dense=True`` Horovod compresses the dense copy ``p.grad.to_dense()``, which
is no parameter's ``.grad``: its name is the parameter of the calling hook.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..codecs.base import Codec
from ..codecs.onebit import saved_codec_repr
from ..transports.mpi import MPICommunicator, default_communicator
from ..exchange.engine import StepEngine
from ..exchange.pipeline import DEFAULT_CHUNK_BYTES
from ..state.compression_state import CompressionState
from ..state.error_feedback import ErrorFeedback
from .adam_defaults import apply_adam_defaults, unrecorded_defaults
from .options_check import calling_optimizer, calling_parameter, check_dense, check_horovod_options, reduction_of
from .param_index import ParamIndex


def _placeholder_scale(output: torch.Tensor) -> float:
    """What Horovod's reduction made of the placeholder 1.0 (1 for Average, K for Sum)."""
    return float(output.reshape(-1)[0])


class CodecCompression:
    """Compressed exchange of every named parameter's gradient with one codec.

    Fields:
        codec: the :class:`~horovod_gradcomp.codecs.base.Codec` encoding each gradient.
        state: this rank's :class:`~horovod_gradcomp.state.CompressionState` (``memory``:
            error-feedback residuals or DGC's momentum and accumulation; the two-phase owner
            residuals; the step counter). ``memory`` is a shortcut to ``state.memory``.
        index: the :class:`~horovod_gradcomp.hvd_adapter.param_index.ParamIndex` naming each ``p.grad``.
        engine: the :class:`~horovod_gradcomp.exchange.engine.StepEngine` (bucket plan, thread,
            patterns, statistics).
        communicator: where payloads travel (a duplicate of COMM_WORLD by default).
    """

    def __init__(self, codec: Codec, named_parameters, *, error_feedback: bool = True, memory=None,
                 pattern: Optional[str] = None, bucket_bytes: Optional[int] = None, overlap: bool = True,
                 communicator: Optional[MPICommunicator] = None, check_agreement: bool = True,
                 timeout: Optional[float] = None, pipeline_bytes: Optional[int] = DEFAULT_CHUNK_BYTES,
                 ranks_per_node: Optional[int] = None, inner_pattern: str = "auto"):
        owner = f"Compression.{codec.name}"
        self.codec = codec
        self.index = ParamIndex(named_parameters, owner=owner)
        self.state = CompressionState(memory if memory is not None else ErrorFeedback(enabled=error_feedback))
        self.communicator = communicator
        sizes = {n: p.numel() * p.element_size() for n, p in zip(self.index.names, self.index.params)}
        self.engine = StepEngine(codec, self.state, self.index.names, sizes, owner=owner, communicator=self.current_communicator,
                                 pattern=pattern, bucket_bytes=bucket_bytes, overlap=overlap,
                                 check_agreement=check_agreement, timeout=timeout, pipeline_bytes=pipeline_bytes,
                                 ranks_per_node=ranks_per_node, inner_pattern=inner_pattern)
        self._results: Dict[str, torch.Tensor] = {}
        self._options_checked = False
        #: Codec options the user passed (never replaced by the Adam defaults; set by the factories).
        self.explicit_options: frozenset = frozenset()
        #: Codec options set after construction (the Adam defaults taken): saved in checkpoints.
        self.adapted_options: Dict[str, object] = {}
        #: True once a checkpoint was loaded: its options stand (no Adam defaults taken after it).
        self.options_from_checkpoint = False

    @property
    def memory(self):
        """This rank's worker memory (``state.memory``)."""
        return self.state.memory

    def current_communicator(self):
        """The communicator of the exchange (the given one, else the process-wide MPI one)."""
        return self.communicator or default_communicator()

    # -- Horovod's Compressor interface -------------------------------------------
    def compress(self, tensor: torch.Tensor):
        """Record ``tensor`` (a parameter's ``.grad``) for this step's exchange; return the
        placeholder and the parameter's name (Horovod's ``ctx``)."""
        if not self._options_checked:
            optimizer = calling_optimizer(self)
            check_horovod_options(optimizer, f"Compression.{self.codec.name}", self.current_communicator())
            self.state.memory.set_reduction(reduction_of(optimizer))  # DGC's clipping threshold refers to it
            apply_adam_defaults(self, optimizer)   # before the first gradient is encoded
            self._options_checked = True
        check_dense(tensor, f"Compression.{self.codec.name}")
        name = self.index.name_of(tensor, lambda: calling_parameter(self))
        self.engine.submit(name, tensor)  # the mean is later written back into this buffer
        # A host placeholder whatever the gradient's device: Horovod reduces CPU tensors in any
        # build, while a CUDA placeholder needs a Horovod built with GPU operations.
        return torch.ones(1, dtype=torch.float32), name

    def decompress(self, output: torch.Tensor, name: Optional[str]) -> torch.Tensor:
        """The mean over ranks of ``name``'s decoded payloads, scaled as Horovod's op asks;
        ``output`` itself when ``name`` is None (a sparse gradient that Horovod exchanged by
        allgather without compressing it)."""
        if name is None:
            return output
        if self.engine.pending:  # the first decompress of the step: every compress is in, flush
            self._results = self.engine.finish()
            self.index.end_step()
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
        results = self.engine.exchange(grads)
        self.index.end_step()
        return results

    def abort_step(self) -> None:
        """Drop a step interrupted by a failed collective (its gradients and partial results)."""
        self.engine.abort_step()
        self._results.clear()
        self.index.end_step()

    # -- options, schedule, introspection and checkpoints ----------------------------
    def set_options(self, options: Dict[str, object]) -> None:
        """Set codec options after construction (the Adam defaults; every rank the same, before
        the first exchange or on load): on the codec, and on a memory that keeps one of them
        (DGC's density schedule). Recorded in ``adapted_options``."""
        for name, value in options.items():
            if not hasattr(self.codec, name):
                raise ValueError(f"Compression.{self.codec.name}: no codec option {name!r}")
            setattr(self.codec, name, value)
            self.memory.set_option(name, value)
            self.adapted_options[name] = value

    def set_epoch(self, epoch: int) -> None:
        """Tell the compression the training epoch (DGC's density warm-up by epoch); every
        rank must call it with the same value, before the epoch's first step."""
        self.memory.set_epoch(epoch)

    def stats(self) -> dict:
        """Cumulative counters for this rank (see :mod:`horovod_gradcomp.exchange.stats`)."""
        return self.engine.stats.as_dict()

    def state_dict(self) -> dict:
        """This rank's state, tagged with the rank and world size it belongs to (residuals and
        owner stripes differ between ranks: save one per rank, or the whole job's at once with
        :func:`~horovod_gradcomp.hvd_adapter.checkpoint.save_job_state`)."""
        comm = self.current_communicator()
        return {"codec": repr(self.codec), "rank": comm.rank, "world_size": comm.size,
                "adapted_options": dict(self.adapted_options),
                # the node layout (None before the first bucket: the state is still empty then)
                "layout": self.engine.layout_key() if self.engine.layout_known else None,
                **self.state.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` of this same rank and world size (``ValueError`` otherwise:
        residuals cannot be redistributed to another number of ranks)."""
        comm = self.current_communicator()
        if "world_size" in state and state["world_size"] != comm.size:
            raise ValueError(f"Compression.{self.codec.name}: this checkpoint was written by a job of "
                             f"{state['world_size']} ranks; this job has {comm.size}. The compression state (error "
                             "feedback, owner stripes) cannot be redistributed: start it fresh instead (do not load it)")
        if "rank" in state and state["rank"] != comm.rank:
            raise ValueError(f"Compression.{self.codec.name}: this checkpoint holds rank {state['rank']}'s state; this "
                             f"is rank {comm.rank}. The state is per rank: load each rank's own file, or use "
                             "hgc.save_job_state / hgc.load_job_state for one file per job")
        recorded = dict(state.get("adapted_options") or {})
        untaken = unrecorded_defaults(self, recorded)
        if untaken:   # taken here (optimizer=) but not by the run that wrote it: its constructor defaults
            self.set_options(untaken)
            for k in untaken:
                del self.adapted_options[k]
        adapted = {k: v for k, v in recorded.items() if k not in self.explicit_options}
        if adapted:   # the Adam defaults the run had taken: the same options again, before comparing
            self.set_options(adapted)
        saved = saved_codec_repr(state.get("codec"))
        if saved != repr(self.codec):
            hint = ""
            if "lr_warmup_steps=" in str(saved) and "lr_warmup_steps=" not in repr(self.codec):
                hint = (" This checkpoint's onebit scales the averaged gradient over its first steps (ramp_steps, "
                        "once onebit's default of 300 steps, is lr_warmup_steps now, default 0): pass the same "
                        "lr_warmup_steps to resume it as it ran.")
            raise ValueError(f"checkpoint was written by {state.get('codec')}, this compression is {self.codec!r}: "
                             "build the compression with the checkpoint's options to resume it (a repr names every "
                             "option that differs from the codec's paper method, e.g. onebit's scales and "
                             "lr_warmup_steps: OneBitCodec(impl='native') is scales='columns', lr_warmup_steps=0)."
                             + hint)
        self.state.load_state_dict(state)
        self.options_from_checkpoint = True
        if state.get("layout") is not None:   # compared once this job's layout is known (its first bucket)
            self.engine.expected_layout = state["layout"]
            self.engine.check_layout()

    def __repr__(self) -> str:
        e = self.engine
        return (f"CodecCompression({self.codec!r}, memory={self.memory!r}, pattern={e.pattern!r}, "
                f"bucket_bytes={e.bucket_bytes}, overlap={e.overlap}, pipeline_bytes={e.pipeline_bytes})")
