"""A bucket's non-finite check, taken from work the encode does anyway.

The preamble (:mod:`horovod_gradcomp.exchange.preamble`) tells every rank whether any rank holds
a NaN or Inf in the bucket before any state is written, so that a skipped step leaves residuals,
velocities and owner residuals as they were. The flag used to come from
:func:`~horovod_gradcomp.exchange.preamble.has_nonfinite`, one more read of every gradient
(about 4 ms of a ResNet-50 step on one core). :func:`measure_bucket` takes it, per codec and
memory (:func:`check_kind`), from:

* ``"measure"`` (onebit in either mode, error feedback on or off): the encode's first pass,
  the column (rows mode: row) scales of ``v = g + r`` (read-only: :meth:`~horovod_gradcomp.codecs.onebit.OneBitCodec.measure`),
  runs before the preamble; the flag is "some scale is NaN or Inf" (a NaN or Inf anywhere in a
  column makes its ``a+`` or ``a-`` non-finite); after the preamble the encode packs with those
  scales, bitwise the payload and residual of the whole encode. Two-phase: a column window's
  scales are the whole tensor's restricted to the window (each column is summed alone, in one
  order); row stripes and copied stripes are measured on their own.
* ``"scales"`` (a ``shared_scale`` codec, TernGrad, with or without error feedback): the local
  scales of every value about to be encoded (``max |v|`` after the optional clipping; a NaN or
  Inf gives a NaN or Inf scale, clipping or not) move before the preamble; the flag is "some
  local scale is non-finite"; the MAX-allreduce after the preamble reuses them. With error
  feedback the scales are those of ``v = g + r``, so no residual is written before every rank
  knows.
* ``"payloads"`` (a codec whose payloads show non-finite input, ``shows_nonfinite``: QSGD, whose
  bucket norm is NaN or Inf then; only without error feedback, when the encode writes no state):
  no check before the exchange. Every rank looks at the norms it receives (one float per QSGD
  bucket of d values, not the gradient) and, where one is non-finite, the step is skipped exactly
  as after the preamble's flag (NaN results everywhere, ``nonfinite_steps`` counted, earlier
  buckets rolled back). Two-phase: an owner that receives a non-finite norm requantizes NaN,
  so that every rank sees it in the owners' payloads. Chosen over measuring the norms before the
  preamble because it needs no pass and no new kernel entry (the QSGD kernels would need a
  "given norms" encode), and the late decision costs the guarantee nothing: nothing QSGD writes
  outlives the step (its kernels map NaN and Inf input to level 0; only the norms carry them).
* ``"norm"`` (DGC with ``clip_norm``): the step's gradient norm (``DGCMemory.begin_step``), a
  read of every gradient before any exchange anyway; a non-finite norm flags every bucket of the
  step on this rank.
* ``"pass"``: :func:`~horovod_gradcomp.exchange.preamble.has_nonfinite` as before, timed as the
  breakdown's ``nonfinite`` phase: DGC without clipping (its momentum correction writes the
  velocities before it selects), codecs with error feedback they do not fuse and no shared
  scale (QSGD with ``error_feedback=True``), the dense warm-up pattern, the hierarchical
  pattern (its encodes read node means, which no rank holds before the preamble) and
  any other codec.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

import torch

from ..codecs.base import Codec
from ..state.memory import Memory
from . import preamble
from .stats import ExchangeStats
from .stripes import matrix_shape

KINDS = ("measure", "scales", "payloads", "norm", "pass")


@dataclass
class Measured:
    """What a bucket's check found before its preamble.

    Fields: kind (:data:`KINDS`, see the module doc); nonfinite (this rank's flag for the
    preamble); options (unit key -> encode options the encode reuses: onebit's ``scales``);
    local (unit key -> local scale, a shared-scale codec's). A unit is what the pattern encodes
    once: a tensor (allgather: its name) or a stripe (two-phase: ``stripe_key(name, owner)``)."""
    kind: str
    nonfinite: bool
    options: Dict[str, dict] = field(default_factory=dict)
    local: Dict[str, float] = field(default_factory=dict)

    @property
    def check_payloads(self) -> bool:
        """True when the pattern must look at the payloads it receives (kind ``"payloads"``)."""
        return self.kind == "payloads"


class Unit(NamedTuple):
    """One encode of a bucket: ``key``, the values (``tensor``, ``residual`` or None) as the
    encode reads them, or, for a column window encoded in place, ``window`` = (name, start, stop)
    of the whole tensor ``tensor`` (residual ``residual``)."""
    key: str
    tensor: torch.Tensor
    residual: Optional[torch.Tensor]
    window: Optional[tuple] = None


def check_kind(codec: Codec, memory: Memory, pattern: str) -> str:
    """How a bucket of ``pattern`` learns about non-finite input (one of :data:`KINDS`, see the
    module doc); the same on every rank (options and pattern only)."""
    if pattern in ("dense", "hierarchical"):  # hierarchical: the encodes see node means, not this gradient
        return "pass"
    if memory.encodes_own_state:
        return "norm" if memory.clip_norm is not None else "pass"
    feedback = memory.keeps_residuals
    if codec.measures and (codec.fuses_feedback or not feedback):
        return "measure"
    if codec.shared_scale:
        return "scales"
    if codec.shows_nonfinite and not feedback:
        return "payloads"
    return "pass"


def peek_residual(memory: Memory, name: str, like: torch.Tensor) -> Optional[torch.Tensor]:
    """``name``'s residual when the memory keeps residuals and one exists, else None
    (a zero residual reads as none: the same scales). Creates nothing."""
    if not memory.keeps_residuals:
        return None
    return memory.peek(name, like)


class EncodesWholeTensors:
    """For a pattern whose encodes are the bucket's tensors, each whole (the allgather): its
    :class:`Unit` s, one per name, keyed by the name, with the residual the encode will read."""

    def units(self, memory: Memory, names: Sequence[str], grads: Mapping[str, torch.Tensor], k: int) -> List[Unit]:
        return [Unit(n, grads[n], peek_residual(memory, n, grads[n])) for n in names]


def measure_bucket(codec: Codec, memory, pattern: str, encodes, grads: Mapping[str, torch.Tensor], k: int,
                   stats: ExchangeStats) -> Measured:
    """This rank's check of one bucket of ``grads`` among ``k`` ranks before its preamble (see the
    module doc). ``pattern``: the bucket's pattern name; ``encodes``: that pattern's object, whose
    ``units(memory, names, grads, k)`` lists the :class:`Unit` s it will encode (asked for kinds
    ``"measure"`` and ``"scales"`` only). Writes no state. Timed as ``encode_s`` (phase
    ``measure``; the pass of kind ``"pass"`` as phase ``nonfinite``)."""
    kind = check_kind(codec, memory, pattern)
    if kind == "pass":
        with stats.timed("encode_s", phase="nonfinite"):
            return Measured(kind, preamble.has_nonfinite(grads))
    if kind == "norm":
        return Measured(kind, bool(memory.step_nonfinite))
    if kind == "payloads":
        return Measured(kind, False)
    with stats.timed("encode_s", phase="measure"):
        units = list(encodes.units(memory, list(grads), grads, k))
        if kind == "measure":
            return _measure_scales(codec, units)
        return _measure_local(codec, units)


def _measure_scales(codec: Codec, units: Sequence[Unit]) -> Measured:
    """onebit: every unit's scales (a window's from its whole tensor's, measured once)."""
    whole: Dict[str, Unit] = {}
    for u in units:
        if u.window is not None:
            whole.setdefault(u.window[0], Unit(u.window[0], u.tensor, u.residual))
    own = [u for u in units if u.window is None]
    measured = list(whole.values()) + own
    scales = codec.measure_many([u.tensor for u in measured], [u.residual for u in measured]) if measured else []
    by_key = {u.key: s for u, s in zip(measured, scales)}
    options = {}
    for u in units:
        if u.window is None:
            options[u.key] = {"scales": by_key[u.key]}
        else:
            name, start, stop = u.window
            cols = matrix_shape(u.tensor.shape)[1]
            options[u.key] = {"scales": codec.window_scales(by_key[name], cols, start, stop)}
    nonfinite = bool(scales) and not bool(torch.isfinite(torch.cat([s.to(scales[0].device) for s in scales])).all())
    return Measured("measure", nonfinite, options=options)


def _measure_local(codec: Codec, units: Sequence[Unit]) -> Measured:
    """A shared-scale codec: every unit's local scale, of ``tensor + residual``."""
    values = [u.tensor if u.residual is None else u.tensor + u.residual for u in units]
    local = [float(s) for s in codec.local_scales_many(values)] if values else []
    return Measured("scales", not all(math.isfinite(s) for s in local),
                    local={u.key: s for u, s in zip(units, local)})


def nonfinite_payloads(codec: Codec, payloads) -> bool:
    """True when any of ``payloads`` (single or stacked) shows non-finite input
    (``codec.payload_nonfinite``: QSGD's norms)."""
    return any(codec.payload_nonfinite(p) for p in payloads)


__all__ = ["KINDS", "EncodesWholeTensors", "Measured", "Unit", "check_kind", "measure_bucket", "nonfinite_payloads",
           "peek_residual"]
