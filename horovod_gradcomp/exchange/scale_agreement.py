"""The encode options every pattern agrees on before bytes travel: shared scales, and the
scales measured before the preamble.

A codec with ``shared_scale`` (TernGrad) encodes every tensor with the maximum over ranks of its
``local_scale``: all of a bucket's scales travel in one MAX-allreduce (:func:`agree_scales`).
The local scales are usually measured before the preamble (they are the non-finite check of a
shared-scale codec, :mod:`horovod_gradcomp.exchange.nonfinite_check`) and only reduced here;
onebit's measured scales join the encode options through :func:`with_measured`. Where each
encode draws its random numbers is :mod:`horovod_gradcomp.exchange.stream_positions`.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from ..codecs.base import Codec
from .requests import Collective, Steps
from .stats import ExchangeStats, StepTotals, allreduce_wire_bytes


def agree_scales(codec: Codec, comm, count: int, compensated: Callable[[], Sequence[torch.Tensor]],
                 stats: ExchangeStats, totals: StepTotals, local: Optional[Sequence[float]] = None) -> Steps:
    """Encode options of each of ``count`` tensors, ``compensated()`` being the values about to
    be encoded: ``{"scale": max over ranks of codec.local_scale(v)}`` for a ``shared_scale``
    codec, in one MAX-allreduce for all of them; ``{}`` each otherwise (``compensated`` is then
    not called). ``local``: the local scales, measured already (before the preamble,
    :mod:`horovod_gradcomp.exchange.nonfinite_check`): ``compensated`` is not called. A request sequence
    (:mod:`horovod_gradcomp.exchange.requests`; ``yield from`` it): every rank must run it with
    the same ``count``."""
    if not codec.shared_scale or count == 0:
        return [{} for _ in range(count)]
    local = measured_or_local_scales(codec, count, compensated, stats, local)
    if comm.size > 1:
        local = yield Collective("allreduce_max", (local,), comm, "scales")
        totals.add(sent=allreduce_wire_bytes(8 * local.size, comm.size))
    return [{"scale": float(s)} for s in local]


def measured_or_local_scales(codec: Codec, count: int, compensated: Callable[[], Sequence[torch.Tensor]],
                             stats: ExchangeStats, local: Optional[Sequence[float]] = None) -> np.ndarray:
    """The ``count`` local scales as a float64 array: ``local`` when measured already, else
    ``codec.local_scales_many`` of ``compensated()`` (timed as encode)."""
    if local is not None:
        if len(local) != count:
            raise ValueError(f"agree_scales: {count} tensors but {len(local)} measured local scales")
        return np.array(local, dtype=np.float64)
    with stats.timed("encode_s"):
        return np.array(codec.local_scales_many(list(compensated())), dtype=np.float64)


def with_measured(options: Sequence[dict], keys: Sequence[str], measured) -> List[dict]:
    """``options`` (one dict per key) merged with the encode options ``measured`` holds for
    ``keys`` (onebit's scales; :class:`~horovod_gradcomp.exchange.nonfinite_check.Measured` or None)."""
    if measured is None or not measured.options:
        return list(options)
    return [dict(o, **m) for o, m in zip(options, measured.options_for(keys))]


__all__ = ["agree_scales", "measured_or_local_scales", "with_measured"]
