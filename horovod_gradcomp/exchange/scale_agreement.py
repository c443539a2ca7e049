"""The encode options every pattern agrees on before bytes travel (:func:`agree_scales`, the same
call in every pattern): a ``shared_scale`` codec's scales (TernGrad: the maximum over ranks of each
tensor's ``local_scale``), and what the non-finite check measured before the preamble
(:mod:`horovod_gradcomp.exchange.nonfinite_check`). Where each encode draws its random numbers:
:mod:`horovod_gradcomp.exchange.stream_positions`.
"""
from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np
import torch

from ..codecs.base import Codec
from .requests import Collective, Steps
from .stats import ExchangeStats, StepTotals, allreduce_wire_bytes


def agree_scales(codec: Codec, comm, keys: Sequence[str], compensated: Callable[[], Sequence[torch.Tensor]],
                 stats: ExchangeStats, totals: StepTotals, measured=None) -> Steps:
    """The encode options of each of ``keys`` (a request sequence, :mod:`.requests`: ``yield from``
    it; every rank runs it with the same number of keys), ``compensated()`` being the values about
    to be encoded. A ``shared_scale`` codec gets ``{"scale": max over ranks of
    codec.local_scale(v)}``, all in one MAX-allreduce; any other ``{}`` (``compensated`` is then not
    called). ``measured``: what the bucket's check measured before the preamble
    (:class:`~horovod_gradcomp.exchange.nonfinite_check.Measured` or None): its local scales are
    reduced instead of measuring again (``compensated`` not called), and its encode options
    (onebit's scales) join the result."""
    count = len(keys)
    options: List[dict] = [{} for _ in range(count)]
    if codec.shared_scale and count:
        local = [measured.local[k] for k in keys] if measured is not None and measured.local else None
        if local is None:
            with stats.timed("encode_s"):
                local = codec.local_scales_many(list(compensated()))
        elif len(local) != count:
            raise ValueError(f"agree_scales: {count} tensors but {len(local)} measured local scales")
        local = np.array(local, dtype=np.float64)
        if comm.size > 1:
            local = yield Collective("allreduce_max", (local,), comm, "scales")
            totals.add(sent=allreduce_wire_bytes(8 * local.size, comm.size))
        options = [{"scale": float(s)} for s in local]
    if measured is None or not measured.options:
        return options
    return [dict(o, **measured.options.get(key, {})) for o, key in zip(options, keys)]


__all__ = ["agree_scales"]
