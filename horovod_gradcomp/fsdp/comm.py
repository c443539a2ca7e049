"""The object FSDP2 calls for one parameter group's reduce-scatter.

:class:`CompressedReduceScatter` implements ``torch.distributed.fsdp``'s ``ReduceScatter``
interface (``allocate`` and ``__call__``) for one ``FSDPModule``: it turns FSDP's ``op`` into
the owner's factor (AVG: 1/K, SUM: 1, PREMUL_SUM(f): f; FSDP applies its pre- and post-divide
factors to the input and output itself, outside this call) and runs the compressed
reduce-scatter job (:mod:`horovod_gradcomp.exchange.reduce_scatter`), or the dense one during
the codec's warm-up steps, through the blocking driver (:mod:`horovod_gradcomp.exchange.blocking_driver`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from ..exchange.reduce_scatter import ShardLayout


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
        owner = f"hgc.fsdp ({self.state.codec.name}, module {self.module or '<root>'!r})"
        if async_op:
            raise NotImplementedError(f"{owner}: async_op=True is not supported yet (FSDP2 on CPU/gloo calls "
                                      "the reduce-scatter synchronously)")
        scale = owner_scale(op, self.layout.world_size, owner)
        self.state.reduce_scatter(self, output_tensor, input_tensor, group, scale, owner)
        return None
