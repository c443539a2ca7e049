"""Horovod's own allreduce behind the same interface as the codecs (``Compression.none/fp16``)."""
from __future__ import annotations

import itertools
import threading
from typing import Optional

import torch

from ..exchange.stats import ExchangeStats, allreduce_wire_bytes


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
