"""A DDP communication hook that exchanges gradients through the codecs.

``register(ddp_model, codec, **options)`` builds the codec's ``hgc.Compression`` (the same
factories, error feedback, DGC memory, patterns and statistics as under Horovod) on a
:class:`~horovod_gradcomp.transports.torch_dist.TorchDistributedCommunicator` and registers
a hook that, per backward pass:

1. takes each DDP bucket's per-parameter gradient views and returns a future without
   communicating, until DDP hands over the bucket marked ``is_last()``;
2. then runs **one** :meth:`CodecCompression.exchange` over every parameter of the step
   (the order is the compression's own, rank-independent; DDP's bucketing does not enter),
   writes each mean over ranks into its view of the bucket, and completes every future.

One exchange per step makes the stream positions, residuals and results exactly those of the
Horovod path with one bucket, so both can be checked against the same oracles. The price:
no bucket's exchange overlaps the rest of backward (as on the Horovod path without
``bucket_bytes``); a per-bucket exchange is not offered yet.
Works with DDP on gloo (CPU) or NCCL: the payloads travel on a separate gloo group.
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional, Tuple

import torch

from ..codecs import available_codecs
from ..horovod.factories import Compression
from ..transports.torch_dist import TorchDistributedCommunicator


class DDPCompressionState:
    """The hook's state: the compression, the name of every parameter and the step's buckets.

    Fields:
        compression: the :class:`~horovod_gradcomp.codec_compression.CodecCompression`.
        communicator: its :class:`TorchDistributedCommunicator`.
    """

    def __init__(self, compression, names: Dict[int, str]):
        self.compression = compression
        self.communicator = compression.communicator
        self._names = names
        self._pending: Dict[str, torch.Tensor] = {}
        self._futures: List[Tuple[torch.futures.Future, torch.Tensor]] = []

    def on_bucket(self, bucket) -> torch.futures.Future:
        """The hook body (see the module doc)."""
        fut: torch.futures.Future = torch.futures.Future()
        self._futures.append((fut, bucket.buffer()))
        for p, g in zip(bucket.parameters(), bucket.gradients()):
            name = self._names.get(id(p))
            if name is None:
                self._fail(KeyError("hgc.ddp: a bucket holds a parameter that is not in the module given to register()"))
            self._pending[name] = g
        if bucket.is_last():
            pending, self._pending = self._pending, {}
            try:
                results = self.compression.exchange(pending)
                for n, r in results.items():
                    if r.data_ptr() != pending[n].data_ptr():
                        pending[n].copy_(r)
            except BaseException as exc:  # every waiting future learns it, then DDP raises
                self._fail(exc)
            futures, self._futures = self._futures, []
            for f, buffer in futures:
                f.set_result(buffer)
        return fut

    def _fail(self, exc: BaseException):
        futures, self._futures, self._pending = self._futures, [], {}
        for f, _ in futures:
            f.set_exception(exc)
        raise exc

    def stats(self) -> dict:
        """The compression's counters (see :mod:`horovod_gradcomp.stats`; one step per DDP
        iteration), plus ``padding_bytes``: bytes gloo sent beyond the payloads when sizes differ."""
        return {**self.compression.stats(), "padding_bytes": self.communicator.padding_bytes}

    def state_dict(self) -> dict:
        return self.compression.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.compression.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.compression.set_epoch(epoch)


def _hook(state, bucket):  # no annotations: DDP compares them to Future[Tensor] objects, not strings
    return state.on_bucket(bucket)


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, codec: str = "onebit", *, group=None,
             communicator: Optional[TorchDistributedCommunicator] = None, **options) -> DDPCompressionState:
    """Register the compressed exchange on ``ddp_model`` and return its state.

    ``codec``: a name of ``hgc.available_codecs()``; ``options`` go to its factory
    (``hgc.Compression.<codec>`` where there is one, else ``hgc.Compression.codec``), e.g.
    ``pattern="two_phase"``, ``error_feedback=False``, ``density=0.01``. ``group``: the
    process group of the exchange (None: a new gloo group over all ranks, so call this on
    every rank at the same point). ``bucket_bytes``/``overlap`` are not taken: the hook
    exchanges once per step. DGC's momentum lives in the compression: use SGD with momentum 0
    (checked before the optimizer's first step, as under Horovod)."""
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"hgc.ddp.register expects a DistributedDataParallel model, got {type(ddp_model).__name__}")
    for key in ("bucket_bytes", "overlap", "transport", "process_set"):
        if key in options:
            raise ValueError(f"hgc.ddp.register: {key}= does not apply to the DDP hook (one exchange per step over "
                             "a torch.distributed group; use group= to choose it)")
    named = [(n, p) for n, p in ddp_model.module.named_parameters() if p.requires_grad]
    if codec not in available_codecs():
        raise ValueError(f"hgc.ddp.register: unknown codec {codec!r}; available: {', '.join(available_codecs())} "
                         "(for DDP's own dense allreduce, register no hook)")
    factory = getattr(Compression, codec, None) or functools.partial(Compression.codec, codec)
    comm = communicator if communicator is not None else TorchDistributedCommunicator(group)
    compression = factory(named, communicator=comm, **options)
    state = DDPCompressionState(compression, {id(p): n for n, p in named})
    ddp_model.register_comm_hook(state, _hook)
    return state
