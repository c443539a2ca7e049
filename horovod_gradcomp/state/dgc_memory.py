"""Deep Gradient Compression's per-worker state (Lin et al., ICLR 2018).

The codec (:mod:`horovod_gradcomp.codecs.dgc`) only selects and packs. This memory holds,
per parameter name and on this rank,

* ``u``: the momentum (velocity) buffer, and
* ``v``: the accumulated, not yet sent, velocity,

and turns a gradient ``g`` into a payload, as the paper writes it, with momentum ``m``:

    g <- g * clip_coef                          local clipping (optional, threshold below)
    u <- m * u + g                              momentum correction
    v <- v + u          (nesterov: v <- v + g + m * u)
    payload = sparse(v) = v's values above the top-``density`` threshold
    v <- v o not(mask)                          what was sent leaves the accumulator
    u <- u o not(mask)                          momentum factor masking (optional, on by default)

and the exchange makes ``p.grad = (1/K) sum_k sparse(v_k)``; the wrapped optimizer
applies ``w <- w - lr * p.grad``. The momentum therefore lives here: the wrapped optimizer
must be plain SGD with ``momentum=0`` (:mod:`horovod_gradcomp.hvd_adapter.optimizer_check` raises
otherwise).

Consequences worth knowing:

* ``density=1`` with ``momentum_masking=False`` is dense momentum SGD exactly: every ``v_k``
  is sent and emptied each step, so the update is ``mean_k(u_k)``, and since the momentum
  recursion is linear, ``mean_k(u_k) = m * mean_k(u_k') + mean_k(g_k)``: the velocity of
  momentum SGD on the averaged gradient (``torch.optim.SGD(momentum=m)``, dampening 0).
* ``density=1`` with masking zeroes every ``u_k`` after each step: that is plain SGD
  without momentum. Masking is meant for sparse updates, where it stops a coordinate's
  stale momentum from pushing it again right after it was applied.
* Local clipping rescales this rank's whole gradient (all tensors of the step together, as
  ``torch.nn.utils.clip_grad_norm_`` does) so that the *reduced* gradient has about the norm
  that clipping it at ``C = clip_norm`` would allow. Where the ranks' gradients differ mostly by
  noise, the norm of a sum of K of them grows as sqrt(K) and that of a mean shrinks as
  1/sqrt(K); so each rank clips to ``C / sqrt(K)`` when the gradients are summed (the paper's
  rule, ``reduction="sum"``, Horovod's ``op=hvd.Sum``) and to ``C * sqrt(K)`` when they are
  averaged (``reduction="mean"``, Horovod's default ``op=hvd.Average``). The compression sets
  the reduction from the optimizer's ``op`` at the first step.
  It needs every gradient of the step, so with clipping the exchange encodes at the flush
  time instead of in the gradient hooks.

Warm-up (:class:`DensitySchedule`): the density falls exponentially from ``start`` to the
final density over ``length`` epochs (or steps), ``density(t) = start * (final/start) **
(t / length)`` for ``t < length`` and ``final`` after; start 0.25 over 4 epochs gives 25%,
6.3%, 1.6%, 0.4%, then 0.1%, the paper's schedule. With ``unit="epoch"`` the training loop
calls ``compression.set_epoch(epoch)``; with ``unit="step"`` the exchanges are counted.

The momentum correction and accumulation is the codec's ``accumulate_`` (one native pass
for fp32 / fp64 gradients on the CPU, and on CUDA when ``_C`` has its CUDA kernels).
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence

import torch

from ..codecs.base import Codec, Payload
from ..codecs.dgc import density_for_mean
from ..flags import require_flag
from .error_feedback import encode_each
from .memory import Memory

WARMUP_UNITS = ("epoch", "step")


class DensitySchedule:
    """Exponential density warm-up: ``start`` at t=0 down to ``final`` at t=``length``.

    ``length == 0`` means no warm-up (always ``final``; ``start`` is ignored)."""

    def __init__(self, final: float, start: float = 0.25, length: int = 0, unit: str = "epoch"):
        if not 0.0 < final <= 1.0:
            raise ValueError(f"dgc: density must be in (0, 1], got {final!r}")
        if length == 0:
            start = final  # no warm-up: the start is unused
        if not final <= start <= 1.0:
            raise ValueError(f"dgc: warmup_start must be in [density, 1] = [{final}, 1], got {start!r}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"dgc: warmup_length must be an int >= 0, got {length!r}")
        if unit not in WARMUP_UNITS:
            raise ValueError(f"dgc: warmup_unit must be one of {WARMUP_UNITS}, got {unit!r}")
        self.final, self.start, self.length, self.unit = float(final), float(start), length, unit

    def density(self, t: int) -> float:
        """The density at epoch or step ``t`` (the unit's count, from 0)."""
        if t >= self.length:
            return self.final
        return self.start * (self.final / self.start) ** (t / self.length)

    def __repr__(self) -> str:
        return f"DensitySchedule(final={self.final}, start={self.start}, length={self.length}, unit={self.unit!r})"


class DGCMemory(Memory):
    """Momentum, accumulation, clipping, masking and warm-up of DGC on one rank (a
    :class:`~horovod_gradcomp.state.memory.Memory`).

    Fields:
        momentum: m in ``u <- m u + g`` (0 <= m < 1).
        nesterov: accumulate ``g + m u`` instead of ``u``.
        momentum_masking: zero ``u`` where a value was sent.
        clip_norm: the clipping threshold C of the reduced gradient (None: no clipping); this
            rank clips its gradient to ``C * sqrt(K)`` (``reduction="mean"``) or ``C / sqrt(K)``
            (``"sum"``).
        reduction: how the ranks' gradients are combined, "mean" or "sum" (:meth:`set_reduction`).
        schedule: the :class:`DensitySchedule` giving each encode its density (the codec's
            own ``density`` stays the final one).
        velocities: name -> ``u``; accumulations: name -> ``v`` (both the gradient's shape
            and dtype, created as zeros on first use; no velocities with momentum 0, where
            ``u`` would only ever hold the last gradient).
        epoch, step: the warm-up clock (``set_epoch``; ``end_step`` counts exchanges).
        momentum_from_optimizer: ``momentum``/``nesterov`` are taken from the wrapped optimizer
            (:meth:`adopt_momentum`) rather than given; they are then saved in checkpoints and
            left out of the options compared on load.
        momentum_restored: a checkpoint set ``momentum``/``nesterov`` (taken in the run that wrote
            it); the optimizer's momentum is not taken again.
        density_given: the user passed the density (``Compression.dgc(density=...)``); when
            False, the density is at least :attr:`density_floor` and encodes of node means
            (:meth:`set_mean_of`) select at ``L`` times it.
        density_floor: with no density given, the smallest density of an encode
            (:func:`~horovod_gradcomp.codecs.dgc.density_floor` of the values one rank encodes per
            step: a small model still sends ``DEFAULT_MIN_VALUES`` values); 0: none. Saved in
            checkpoints: a run resumes with the floor it was written with (0 for a checkpoint
            written before the floor existed).
        mean_of: L, the ranks each encoded value is a mean of (1 on the flat exchange).
    """

    #: The codec encodes the accumulated velocity, not the gradient: the non-finite check is the
    #: step's norm (with clipping) or a read of the gradients.
    encodes_own_state = True

    def __init__(self, schedule: DensitySchedule, momentum: float = 0.9, nesterov: bool = False,
                 momentum_masking: bool = True, clip_norm: Optional[float] = None,
                 momentum_from_optimizer: bool = False, density_given: bool = True):
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
            raise ValueError(f"dgc: momentum must be a number in [0, 1), got {momentum!r}")
        if clip_norm is not None and (isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float))
                                      or not clip_norm > 0 or math.isinf(clip_norm)):
            raise ValueError(f"dgc: clip_norm must be a positive number or None, got {clip_norm!r}")
        self.schedule = schedule
        self.momentum = float(momentum)
        self.nesterov = require_flag("dgc", "nesterov", nesterov)
        self.momentum_masking = require_flag("dgc", "momentum_masking", momentum_masking)
        self.momentum_from_optimizer = bool(momentum_from_optimizer)
        self.momentum_restored = False
        self.density_given = bool(density_given)
        self.density_floor = 0.0
        self.mean_of = 1
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.velocities: Dict[str, torch.Tensor] = {}
        self.accumulations: Dict[str, torch.Tensor] = {}
        self.epoch = 0
        self.step = 0
        self.reduction = "mean"
        self._clip_coef = 1.0
        #: True when this step's gradient norm (:meth:`begin_step`, clipping on) is NaN or Inf.
        self.step_nonfinite = False

    # -- the memory interface the exchange uses ---------------------------------------------
    @property
    def needs_all_grads(self) -> bool:
        """True when encoding needs every gradient of the step first (global clipping)."""
        return self.clip_norm is not None

    def agreement_key(self) -> str:
        """What every rank must agree on: the options, the momentum in use and this step's density."""
        return f"{self!r} momentum={self.momentum} nesterov={self.nesterov} density={self.current_density()!r}"

    def begin_step(self, grads: Mapping[str, torch.Tensor], world_size: int) -> None:
        """Compute this step's clipping coefficient from all of this rank's gradients, and
        :attr:`step_nonfinite` (the exchange's non-finite check with clipping: the norm is a
        read of every gradient before any exchange anyway)."""
        if self.clip_norm is None:
            return
        sq = sum(float(g.detach().double().pow(2).sum()) for g in grads.values())
        self.step_nonfinite = not math.isfinite(sq)
        limit = self.clip_limit(world_size)
        self._clip_coef = min(1.0, limit / (math.sqrt(sq) + 1e-6)) if not self.step_nonfinite else 1.0

    def set_reduction(self, reduction: str) -> None:
        """"mean" (Horovod's ``op=hvd.Average``) or "sum" (``op=hvd.Sum``): what the clipping
        threshold refers to (see the module doc)."""
        if reduction not in ("mean", "sum"):
            raise ValueError(f"dgc: reduction must be 'mean' or 'sum', got {reduction!r}")
        self.reduction = reduction

    def clock(self) -> Dict[str, int]:
        """The warm-up clock: ``epoch`` and ``memory_step`` (exchanges counted here)."""
        return {"epoch": self.epoch, "memory_step": self.step}

    def set_clock(self, clock: Mapping[str, int]) -> None:
        super().set_clock(clock)
        self.epoch, self.step = int(clock["epoch"]), int(clock["memory_step"])

    def clip_limit(self, world_size: int) -> float:
        """This rank's gradient-norm limit: ``C * sqrt(K)`` for a mean, ``C / sqrt(K)`` for a sum."""
        root = math.sqrt(world_size)
        return self.clip_norm * root if self.reduction == "mean" else self.clip_norm / root

    def end_step(self) -> None:
        self.step += 1
        self._clip_coef = 1.0
        self.step_nonfinite = False

    def adopt_momentum(self, momentum: float, nesterov: bool) -> None:
        """Take the wrapped optimizer's momentum (``Compression.dgc(momentum=None)``). After a
        checkpoint restored the momentum taken in the run that wrote it, nothing more is taken:
        that run's optimizer was left at momentum 0, so a resumed optimizer holds 0 too."""
        if not self.momentum_restored:
            self._set_momentum(momentum, nesterov)

    def _set_momentum(self, momentum: float, nesterov: bool) -> None:
        if isinstance(momentum, bool) or not 0.0 <= float(momentum) < 1.0:
            raise ValueError(f"dgc: the optimizer's momentum must be in [0, 1), got {momentum!r}")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def set_option(self, name: str, value) -> None:
        """A codec option set after construction (:meth:`CodecCompression.set_options`): ``density``
        is the schedule's final density (its start raised to it when below); others are not kept here."""
        if name == "density":
            s = self.schedule
            self.schedule = DensitySchedule(value, start=max(s.start, float(value)), length=s.length, unit=s.unit)

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the warm-up clock (``unit="epoch"``)."""
        super().set_epoch(epoch)
        self.epoch = epoch

    def set_mean_of(self, ranks: int) -> None:
        """The values this memory encodes are means of ``ranks`` ranks' gradients (the
        hierarchical exchange's node means, L ranks per node; 1: each rank's own). When the user
        gave no density (``density_given`` False: the codec's default, or the Adam default), every
        encode then selects at ``min(1, L * d)`` (:func:`~horovod_gradcomp.codecs.dgc.density_for_mean`),
        so that as many values move per step as on the flat exchange at ``d``; a density the
        user gave is used as given. Not saved: the exchange sets it from the node layout."""
        density_for_mean(self.schedule.final, ranks)   # refuses a bad count
        self.mean_of = ranks

    def set_density_floor(self, floor: float) -> None:
        """:attr:`density_floor` (a number in [0, 1]); used only when the user gave no density."""
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0.0 <= floor <= 1.0:
            raise ValueError(f"dgc: the density floor must be a number in [0, 1], got {floor!r}")
        self.density_floor = float(floor)

    def scheduled_density(self) -> float:
        """The density warm-up's density at this epoch or step (:class:`DensitySchedule`)."""
        return self.schedule.density(self.epoch if self.schedule.unit == "epoch" else self.step)

    def current_density(self) -> float:
        """The density of this step's encodes: :meth:`scheduled_density`; when the user gave no
        density, at least :attr:`density_floor`, then times L for node means (:meth:`set_mean_of`),
        at most 1."""
        d = self.scheduled_density()
        if self.density_given:
            return d
        d = max(d, self.density_floor)
        return d if self.mean_of == 1 else density_for_mean(d, self.mean_of)

    def _buffer(self, store: Dict[str, torch.Tensor], name: str, like: torch.Tensor) -> torch.Tensor:
        buf = store.get(name)
        if buf is None:
            buf = store[name] = torch.zeros_like(like, memory_format=torch.contiguous_format)
        elif buf.shape != like.shape or buf.dtype != like.dtype or buf.device != like.device:
            raise ValueError(f"dgc: gradient of {name!r} is {tuple(like.shape)}/{like.dtype}/{like.device} but its "
                             f"state is {tuple(buf.shape)}/{buf.dtype}/{buf.device}; was a checkpoint for another "
                             "model loaded?")
        return buf

    def encode(self, codec: Codec, name: str, grad: torch.Tensor) -> Payload:
        """Fold ``grad`` into ``name``'s momentum and accumulation, select, mask; return the payload.

        With momentum 0, ``u`` would be ``c * g`` itself at every step (``u <- 0 * u + c g``), so
        no velocity is kept: ``v <- v + c g`` directly, with the same two roundings (one pass
        and one model-sized buffer less)."""
        v = self._buffer(self.accumulations, name, grad)
        if self.momentum == 0.0:
            u = None
            v.add_(grad if self._clip_coef == 1.0 else grad * self._clip_coef)
        else:
            u = self._buffer(self.velocities, name, grad)
            codec.accumulate_(u, v, grad, self.momentum, self.nesterov, self._clip_coef)
        payload, sent = codec.encode_with_indices(v, density=self.current_density())
        sent = sent.long()
        v.view(-1).index_fill_(0, sent, 0)
        if self.momentum_masking and u is not None:
            u.view(-1).index_fill_(0, sent, 0)
        return payload

    def encode_many(self, codec: Codec, names: Sequence[str], grads: Sequence[torch.Tensor],
                    options: Optional[Sequence[dict]] = None, positions: Optional[Sequence[int]] = None) -> List[Payload]:
        """:meth:`encode` of each of a bucket's names in order, tensor i from stream position
        ``positions[i]`` (``options`` must be empty dicts: DGC takes none). Where the codec has
        bucket ops (:meth:`~horovod_gradcomp.codecs.dgc.DGCCodec.bucket_ops`), each step runs once for
        the whole bucket: the momentum correction, the selection and index coding
        (:meth:`~horovod_gradcomp.codecs.dgc.DGCCodec.encode_many_with_indices`), the masking; a
        fixed number of device calls whatever the tensor count, and the same payloads and state,
        bitwise (each name's state is its own, so the order of the steps across names does not
        matter)."""
        if not codec.bucket_ops([g.device for g in grads]):
            return encode_each(self, codec, names, grads, options, positions)
        if options is not None and any(options):
            raise TypeError(f"dgc: encode takes no options, got {list(options)!r}")
        vs = [self._buffer(self.accumulations, n, g) for n, g in zip(names, grads)]
        us = None
        if self.momentum == 0.0:
            for v, g in zip(vs, grads):
                v.add_(g if self._clip_coef == 1.0 else g * self._clip_coef)
        else:
            us = [self._buffer(self.velocities, n, g) for n, g in zip(names, grads)]
            codec.accumulate_many_(us, vs, grads, self.momentum, self.nesterov, self._clip_coef)
        payloads, sent = codec.encode_many_with_indices(vs, self.current_density(), positions)
        codec.mask_sent_many(sent, vs, us if self.momentum_masking else None)
        return payloads

    def snapshot(self, names) -> dict:
        """Copies of the velocity and accumulation of ``names``, for :meth:`restore`."""
        return {n: tuple(store[n].clone() if n in store else None for store in (self.velocities, self.accumulations))
                for n in names}

    def restore(self, snapshot: dict) -> None:
        """Put back what :meth:`snapshot` copied."""
        for n, saved in snapshot.items():
            for store, t in zip((self.velocities, self.accumulations), saved):
                if t is None:
                    store.pop(n, None)
                else:
                    store[n].copy_(t)

    # -- checkpoints ------------------------------------------------------------------
    def stores(self) -> Dict[str, Dict[str, torch.Tensor]]:
        return {"velocities": self.velocities, "accumulations": self.accumulations}

    def state_dict(self) -> dict:
        return {"velocities": {k: t.detach().clone() for k, t in self.velocities.items()},
                "accumulations": {k: t.detach().clone() for k, t in self.accumulations.items()},
                "epoch": self.epoch, "step": self.step, "momentum": self.momentum, "nesterov": self.nesterov,
                "density_floor": self.density_floor}

    def load_state_dict(self, state: dict) -> None:
        self.velocities = {k: t.clone() for k, t in dict(state["velocities"]).items()}
        self.accumulations = {k: t.clone() for k, t in dict(state["accumulations"]).items()}
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.set_density_floor(state.get("density_floor", 0.0))
        if self.momentum_from_optimizer and "momentum" in state:
            self._set_momentum(state["momentum"], state["nesterov"])
            self.momentum_restored = True

    def __repr__(self) -> str:
        if self.momentum_from_optimizer:
            return (f"DGCMemory(momentum=from optimizer, momentum_masking={self.momentum_masking}, "
                    f"clip_norm={self.clip_norm}, schedule={self.schedule!r})")
        return (f"DGCMemory(momentum={self.momentum}, nesterov={self.nesterov}, "
                f"momentum_masking={self.momentum_masking}, clip_norm={self.clip_norm}, schedule={self.schedule!r})")
