"""Horovod's own allreduce behind the same interface as the codecs (``Compression.none/fp16``).

Sparse gradients (Horovod allgathers them itself and calls ``decompress(x, None)``) pass
through untouched and are not counted. With ``process_set=``, :meth:`DenseCompression.exchange`
reduces over the set and the statistics count the set's ranks; on a rank outside the set the
object is inert, like Horovod's optimizer there.
"""
from __future__ import annotations

import itertools
import threading
from typing import Optional

import torch

from ..exchange.stats import ExchangeStats, StepTotals, allreduce_wire_bytes
from ..exchange.watchdog import default_watchdog, resolve_timeout


class DenseCompression:
    """Horovod's own allreduce of the gradient, optionally cast to a wire dtype (fp16),
    with the same ``stats()`` as the codecs so that results compare on one API."""

    _calls: dict = {}   # process set id -> the numbering of exchange() calls on that set
    _calls_lock = threading.Lock()

    def __init__(self, wire_dtype: Optional[torch.dtype] = None, process_set=None, timeout: Optional[float] = None):
        self.wire_dtype = wire_dtype
        self.process_set = process_set
        self.timeout = resolve_timeout(timeout)
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
            k = self._size()
            self._stats.record_step(StepTotals(self._step_tensors, self._step_bytes, self._step_numel,
                                               allreduce_wire_bytes(self._step_bytes, k), k))
            self._step_open = False
            self._step_numel = self._step_bytes = self._step_tensors = 0
        if ctx is None:  # a sparse gradient Horovod allgathered itself: never compressed here
            return tensor
        return tensor if tensor.dtype == ctx else tensor.to(ctx)

    def _size(self) -> int:
        import horovod.torch as hvd
        return hvd.size() if self.process_set is None else int(self.process_set.size())

    def exchange(self, grads: dict) -> dict:
        """One whole step without the optimizer's hooks: name -> mean over ranks of
        ``grads[name]`` through Horovod's allreduce (in the wire dtype), every name in one
        grouped allreduce (same names on every rank), under the stall watchdog's deadline.

        The allreduce is named ``hgc.dense.<set>.<call>``, numbered per process set: Horovod's
        automatic names number *every* Horovod op of the process, so an op issued from another
        thread (a barrier, a pipeline's exchange thread) would shift them differently on each
        rank and the ranks would wait for different names (a deadlock)."""
        import horovod.torch as hvd
        ps = self.process_set if self.process_set is not None else hvd.global_process_set
        if ps.ranks is not None and hvd.rank() not in ps.ranks:
            raise ValueError(f"Compression.none/fp16: rank {hvd.rank()} is not in {ps}: this compression is inert "
                             "here (as Horovod's optimizer is); it must not exchange")
        names = sorted(grads)
        with self._exchange_lock:
            with DenseCompression._calls_lock:
                numbering = DenseCompression._calls.setdefault(ps.process_set_id, itertools.count())
                call = f"hgc.dense.ps{ps.process_set_id}.{next(numbering)}"
            sent = [self.compress(grads[n]) for n in names]
            what = f"Compression.none/fp16: exchange {call} ({len(names)} tensors), rank {hvd.rank()}"
            with default_watchdog().guard(self.timeout, what):
                outs = hvd.grouped_allreduce([t for t, _ in sent], op=hvd.Average, name=call, process_set=ps)
            return {n: self.decompress(o, ctx) for n, o, (_, ctx) in zip(names, outs, sent)}

    def stats(self) -> dict:
        return self._stats.as_dict()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
