"""The object FSDP2 calls for one parameter group's reduce-scatter.

:class:`CompressedReduceScatter` implements ``torch.distributed.fsdp``'s ``ReduceScatter``
interface (``allocate`` and ``__call__``) for one ``FSDPModule``: it turns FSDP's ``op`` into
the owner's factor (AVG: 1/K, SUM: 1, PREMUL_SUM(f): f; FSDP applies its pre- and post-divide
factors to the input and output itself, outside this call) and runs the compressed
reduce-scatter job (:mod:`horovod_gradcomp.exchange.reduce_scatter`), or the dense one during
the codec's warm-up steps, through the blocking driver (:mod:`horovod_gradcomp.exchange.blocking_driver`).

What FSDP2 does with it (torch 2.13): its only call of the custom reduce-scatter,
``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:619`` in ``foreach_reduce``, runs inside
``with device_handle.stream(reduce_scatter_stream)``, passes ``output_tensor``, ``input_tensor``,
``group`` and ``op`` and never ``async_op`` (so False), and drops the returned value: FSDP2 orders
its later work (the all-reduce hook, the post-divide, the gradient copy-out) with the reduce-scatter
stream's event, ``reduce_scatter_stream.record_event()`` at :632, not with a ``Work``
(tests/test_fsdp_runtime.py records the calls). So FSDP2 never asks for a pending work here, and
nothing in its path could overlap a returned one with its own computation.

``async_op=True`` (another caller): the reduce-scatter still runs to its end inside the call, on the
calling thread and the current stream (on CUDA: the stream FSDP2 makes current for its
reduce-scatters; the decode's kernels are queued there), and the call returns a :class:`CompletedWork`, a
``torch.distributed.Work`` that is already complete: ``wait()`` returns True at once, as a NCCL
work's ``wait()`` does once its kernels are ordered before the current stream's later work. Nothing
overlaps with the caller's next computation: the work is done before the call returns.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from ..exchange.reduce_scatter import ShardLayout


class CompletedWork(dist.Work):
    """A ``torch.distributed.Work`` for a collective that ran to its end before it was returned
    (see the module doc): ``wait()``, ``is_completed()`` and ``is_success()`` are True,
    ``exception()`` is None, ``result()`` and ``get_future()``'s value are ``[output]``."""

    def __init__(self, output: torch.Tensor):
        super().__init__()
        self.output = output

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def synchronize(self) -> None:
        return None

    def block_current_stream(self) -> None:
        """Nothing to order: the work was queued on the current stream when it ran."""
        return None

    def result(self):
        return [self.output]

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result([self.output])
        return future


def owner_scale(op, k: int, owner: str) -> float:
    """The factor of the owner's sum for FSDP's reduce ``op`` over ``k`` ranks."""
    kind = getattr(op, "op", op)
    if kind == dist.ReduceOp.AVG:
        return 1.0 / k
    if kind == dist.ReduceOp.SUM:
        return 1.0
    if kind == dist.ReduceOp.PREMUL_SUM and hasattr(op, "factor"):
        return float(op.factor)
    raise ValueError(f"{owner}: FSDP asked for a reduce-scatter with op {op!r}; the compressed reduce-scatter "
                     "takes AVG, SUM or PREMUL_SUM")


class CompressedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter of one ``FSDPModule`` through a codec (see the module doc).

    Fields: state (the :class:`~horovod_gradcomp.fsdp.state.FSDPCompressionState`), module
    (the module's name in the model, "" for the root), index (its place among the state's
    modules), layout (its :class:`ShardLayout`)."""

    def __init__(self, state, module: str, index: int, layout: ShardLayout):
        self.state, self.module, self.index, self.layout = state, module, index, layout

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        """Reduce-scatter ``input_tensor`` into ``output_tensor`` through the codec; returns None, or
        with ``async_op`` a :class:`CompletedWork` (the work is done either way: see the module doc)."""
        owner = f"hgc.fsdp ({self.state.codec.name}, module {self.module or '<root>'!r})"
        scale = owner_scale(op, self.layout.world_size, owner)
        self.state.reduce_scatter(self, output_tensor, input_tensor, group, scale, owner)
        return CompletedWork(output_tensor) if async_op else None
