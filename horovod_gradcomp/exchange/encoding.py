"""What both exchange patterns share before bytes travel: where each encode draws its random
numbers, and the one agreement on shared scales.

Stream positions. A stochastic codec is reset to a position before every encode, so its random
numbers depend on (step, tensor, stripe, phase) and never on the order in which hooks fire:

    position = ((step * P + i) * S + s) * F + f

with P the number of parameters, i the tensor's index in the sorted names, S stripes per
tensor and F encodes per stripe. The allgather pattern encodes each tensor once (S = F = 1:
``step * P + i``); the two-phase pattern cuts each tensor into S = K stripes, encoded by
their worker (f = 0) and requantized by their owner (f = 1).

Shared scales. A codec with ``shared_scale`` (TernGrad) encodes every tensor with the maximum
over ranks of its ``local_scale``: all of a bucket's scales travel in one MAX-allreduce.
The local scales are usually measured before the preamble (they are the non-finite check of a
shared-scale codec, :mod:`horovod_gradcomp.exchange.measure`) and only reduced here.
"""
from __future__ import annotations

from typing import Callable, List, Mapping, Optional, Sequence

import numpy as np
import torch

from ..codecs.base import Codec
from .stats import ExchangeStats, StepTotals, allreduce_wire_bytes


def stream_position(step: int, num_params: int, index: int, stripes: int = 1, stripe: int = 0,
                    phases: int = 1, phase: int = 0) -> int:
    """``((step * num_params + index) * stripes + stripe) * phases + phase`` (see the module doc)."""
    return ((step * num_params + index) * stripes + stripe) * phases + phase


class StepPositions:
    """``positions(name, stripe=0, phase=0)``: :func:`stream_position` of one step's encodes.

    Fields: step, order (name -> index i, the sorted names), stripes (S), phases (F)."""

    def __init__(self, step: int, order: Mapping[str, int], stripes: int = 1, phases: int = 1):
        self.step, self.order, self.stripes, self.phases = step, order, stripes, phases

    def __call__(self, name: str, stripe: int = 0, phase: int = 0) -> int:
        return stream_position(self.step, len(self.order), self.order[name], self.stripes, stripe, self.phases, phase)


def local_scales(codec: Codec, values: Sequence[torch.Tensor]) -> List[float]:
    """``codec.local_scale(v)`` of each value, through the codec's bucket version
    ``local_scales_many`` (TernGrad: one read back for all)."""
    return list(codec.local_scales_many(values))


def agree_scales(codec: Codec, comm, count: int, compensated: Callable[[], Sequence[torch.Tensor]],
                 stats: ExchangeStats, totals: StepTotals, local: Optional[Sequence[float]] = None) -> List[dict]:
    """Encode options of each of ``count`` tensors, ``compensated()`` being the values about to
    be encoded: ``{"scale": max over ranks of codec.local_scale(v)}`` for a ``shared_scale``
    codec, in one MAX-allreduce for all of them; ``{}`` each otherwise (``compensated`` is then
    not called). ``local``: the local scales, measured already (before the preamble,
    :mod:`horovod_gradcomp.exchange.measure`): ``compensated`` is not called. Every rank must
    call it with the same ``count`` (a collective)."""
    if not codec.shared_scale or count == 0:
        return [{} for _ in range(count)]
    local = measured_or_local_scales(codec, count, compensated, stats, local)
    if comm.size > 1:
        with stats.timed("exchange_s"):
            local = comm.allreduce_max(local)
        totals.add(sent=allreduce_wire_bytes(8 * local.size, comm.size))
    return [{"scale": float(s)} for s in local]


def measured_or_local_scales(codec: Codec, count: int, compensated: Callable[[], Sequence[torch.Tensor]],
                             stats: ExchangeStats, local: Optional[Sequence[float]] = None) -> np.ndarray:
    """The ``count`` local scales as a float64 array: ``local`` when measured already, else
    :func:`local_scales` of ``compensated()`` (timed as encode)."""
    if local is not None:
        if len(local) != count:
            raise ValueError(f"agree_scales: {count} tensors but {len(local)} measured local scales")
        return np.array(local, dtype=np.float64)
    with stats.timed("encode_s"):
        return np.array(local_scales(codec, list(compensated())), dtype=np.float64)


def with_measured(options: Sequence[dict], keys: Sequence[str], measured) -> List[dict]:
    """``options`` (one dict per key) merged with the encode options ``measured`` holds for
    ``keys`` (onebit's scales; :class:`~horovod_gradcomp.exchange.measure.Measured` or None)."""
    if measured is None or not measured.options:
        return list(options)
    return [dict(o, **m) for o, m in zip(options, measured.options_for(keys))]

