"""The codec interface: encode a tensor into a :class:`Payload`, decode it back.

A codec holds options only. Per-parameter state (error-feedback residuals, momentum)
lives in :mod:`horovod_gradcomp.state`, which hands a codec that
supports it the residual to update in the same pass as the encoding.
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

import torch

from .payload import BufferSpec, Payload  # (re-exported: the codecs' modules take them from here)
from .payload_checks import check_payload_list


class Codec:
    """Base class of every codec.

    Subclasses set ``name`` and implement :meth:`encode`, :meth:`decode` and
    :meth:`layout`; they may override :meth:`decode_mean_stacked` with a fused kernel.
    The class attributes below are the codec's declared capabilities: the exchange reads them
    (never probes for them), so a subclass sets the ones that differ from the defaults (on the
    class, or on the instance where an option decides, as QSGD's ``coding`` decides
    ``variable_size``) and implements the methods they promise.
    """

    name: str = "codec"
    #: True when ``encode(tensor, residual=r)`` updates ``r`` itself (fused error feedback).
    fuses_feedback: bool = False
    #: Whether the ``Compression`` factories keep an error-feedback residual for this codec
    #: unless told otherwise (the method's own recipe: on for 1-bit SGD, off for the
    #: unbiased stochastic quantizers, whose papers use none).
    error_feedback_default: bool = True
    #: The exchange pattern the factories use unless told otherwise (``pattern=None``):
    #: "allgather" or "auto" (two-phase when it sends fewer bytes). Chosen from speed and
    #: accuracy measured at K=4 (docs/results/README.md, "Two-phase against the allgather" and
    #: "onebit's column windows"): QSGD, TernGrad and onebit default to "auto" (two-phase faster at 1 Gbit/s,
    #: ahead of fp16 at 10 Gbit/s, the char-LM's loss about unchanged; TernGrad's owners send
    #: exact sums, see codecs/ternary_sum.py; onebit's column stripes are encoded in place).
    #: DGC's payloads vary in size, so it has the allgather only.
    default_pattern: str = "allgather"
    #: Codec options that replace the constructor's defaults when the wrapped optimizer is of
    #: the Adam family and the user did not pass them (:mod:`horovod_gradcomp.hvd_adapter.adam_defaults`;
    #: measured on the char model: docs/results/adam_table.md). Empty: the same defaults for every
    #: optimizer.
    adam_defaults: dict = {}
    #: The same for ``torch.optim.SGD`` (with or without momentum; measured on the char model:
    #: docs/results/defaults_check.md). Empty: the constructor's defaults under SGD.
    sgd_defaults: dict = {}
    #: Codec options that replace the constructor's defaults in the ``Compression`` factories and
    #: the DDP hook (not in ``get_codec``, which builds the method as its paper states it) when
    #: the user did not pass them. Empty: the constructor's defaults everywhere.
    adapter_defaults: dict = {}
    #: True when a payload's size depends on the values, not only on the shape and dtype (DGC;
    #: QSGD's Elias coding): there is no :meth:`layout` to cut a receive buffer with, the
    #: exchange gathers the sizes first, and the two-phase pattern does not apply.
    variable_size: bool = False
    #: True when the ranks agree on one scale per tensor before encoding it: the MAX over ranks
    #: of :meth:`local_scale`, given to :meth:`encode` as ``scale=`` (TernGrad).
    shared_scale: bool = False
    #: True when :meth:`measure_many` gives the scales the encode will use from its first pass
    #: alone (onebit): the exchange takes its non-finite check from them before its preamble and
    #: encodes with them after it.
    measures: bool = False
    #: The first ``warmup_steps`` exchanges of a compression average the gradients at full
    #: precision (the dense pattern) before the codec takes over; 0: none (an option of onebit
    #: and TernGrad).
    warmup_steps: int = 0
    #: The averaged gradients of step t < ``lr_warmup_steps`` are multiplied by (t + 1) / N (a
    #: learning-rate warm-up; an option of onebit); 0: none.
    lr_warmup_steps: int = 0
    #: The index of this rank's random stream, for the stochastic codecs (TernGrad, QSGD, DGC:
    #: set from the rank, and again after an elastic restart); None: the codec draws no random
    #: numbers.
    rank_stream: Optional[int] = None

    #: The implementations a codec can be built with: "native" (``_C``: the CPU kernels, and
    #: the device kernels for CUDA tensors), "reference" (pure torch, the oracle) and "twin"
    #: (``_C_twin``: the device kernels built for the CPU by Thrust's OpenMP backend; CPU tensors).
    IMPLS = ("native", "reference", "twin")

    def __init__(self, impl: str = "native"):
        if impl not in self.IMPLS:
            raise ValueError(f"{self.name}: impl must be one of {', '.join(map(repr, self.IMPLS))}, got {impl!r}")
        self.impl = impl

    @property
    def uses_kernels(self) -> bool:
        """True when this codec runs an extension's kernels (impl "native" or "twin")."""
        return self.impl != "reference"

    # -- to implement -------------------------------------------------------------
    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Payload:
        raise NotImplementedError

    #: True when a payload of non-finite input shows it (:meth:`payload_nonfinite`), so that the
    #: exchange may find a NaN or Inf in what it receives instead of reading the gradients first
    #: (:mod:`horovod_gradcomp.exchange.nonfinite_check`, kind "payloads").
    shows_nonfinite: bool = False

    def payload_nonfinite(self, payload: Payload) -> bool:
        """True when ``payload`` (single or stacked) was encoded from non-finite input; only for
        codecs with ``shows_nonfinite``."""
        raise NotImplementedError(f"{self.name}: its payloads do not show non-finite input")

    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The tensor the payload stands for (shape, dtype, device of the original);
        written into ``out`` when given."""
        raise NotImplementedError

    def layout(self, shape: Sequence[int], dtype: torch.dtype) -> List[BufferSpec]:
        """The buffers of a payload for a tensor of this shape and dtype, in wire order.

        Fixed-size codecs only: the exchange uses it to cut receive buffers into payloads.
        """
        raise NotImplementedError

    def local_scale(self, tensor: torch.Tensor) -> float:
        """This rank's proposal for ``tensor``'s shared scale (the ranks agree on the MAX of
        their proposals). Only for codecs with ``shared_scale``."""
        raise NotImplementedError(f"{self.name}: no shared scale (shared_scale is False)")

    def local_scales_many(self, tensors: Sequence[torch.Tensor]) -> List[float]:
        """``[local_scale(t) for t in tensors]``; a codec may compute them in one bucket op
        (TernGrad: one read back for all), with the same values."""
        return [self.local_scale(t) for t in tensors]

    def measure_many(self, tensors: Sequence[torch.Tensor],
                     residuals: Optional[Sequence[Optional[torch.Tensor]]] = None) -> List[torch.Tensor]:
        """The scales each ``encode(tensors[i], residuals[i])`` would put in its payload, from its
        first pass alone (nothing written; ``residuals`` None: none), for the encode to take back.
        Only for codecs with ``measures``."""
        raise NotImplementedError(f"{self.name}: no separate measure pass (measures is False)")

    def owner_sum_codec(self, k: int) -> Optional["Codec"]:
        """The codec of a two-phase owner's exact sum of K of this codec's payloads, for codecs
        whose sum has a compact exact form (TernGrad: the shared scale times an integer in
        [-K, K]); None (the default): the owner quantizes the mean again with this codec."""
        return None

    def encodes_column_windows(self, tensor: torch.Tensor, width: int) -> bool:
        """True when :meth:`encode_columns` and :meth:`decode_columns` work on a ``width``-column
        window of ``tensor`` in place, with a native strided kernel for its device and dtype.
        False (the default): the two-phase exchange copies its column stripes in and out."""
        return False

    def encode_columns(self, tensor: torch.Tensor, residual: Optional[torch.Tensor], start: int,
                       stop: int) -> Payload:
        """The payload of columns ``[start, stop)`` of ``tensor``'s 2-D view ``[shape[0], -1]``
        (payload shape ``[shape[0], stop - start]``): the same bytes as encoding a contiguous
        copy of that window with the same window of ``residual``, which is updated in place.
        Only where :meth:`encodes_column_windows` says so."""
        raise NotImplementedError(f"{self.name}: no column-window encode")

    def decode_columns(self, payload: Payload, out: torch.Tensor, start: int) -> None:
        """Decode ``payload`` (of shape ``[rows, width]``) into columns ``[start, start + width)``
        of ``out``'s 2-D view, leaving its other columns alone. Only where
        :meth:`encodes_column_windows` says so."""
        raise NotImplementedError(f"{self.name}: no column-window decode")

    # -- a bucket at once (the device kernels' multi-tensor ops) -----------------------
    def bucket_ops(self, devices: Sequence[torch.device]) -> bool:
        """True when :meth:`encode_many` and :meth:`decode_mean_stacked_many` run this codec's
        bucket ops on a bucket whose tensors are on ``devices``: one fixed, small sequence of device algorithm calls for the
        whole bucket (csrc/device/multi_tensor.cuh), i.e. the device kernels (impl "twin" on CPU
        tensors, impl "native" on CUDA tensors). False (the default): tensor by tensor, with the
        same results."""
        return False

    def encode_many(self, tensors: Sequence[torch.Tensor], residuals: Optional[Sequence[torch.Tensor]] = None,
                    options: Optional[Sequence[dict]] = None,
                    positions: Optional[Sequence[int]] = None) -> List[Payload]:
        """``[encode(tensors[i], residual=residuals[i], **options[i])]``, tensor i drawn from stream
        position ``positions[i]`` (stochastic codecs; None: from the current position on). The
        residuals (a fused-feedback codec's, updated in place) are given for every tensor or for
        none. Bitwise the payloads and residuals of the per-tensor calls; a codec whose
        :meth:`bucket_ops` accepts the tensors computes them in one bucket op."""
        payloads = []
        for i, t in enumerate(tensors):
            if positions is not None:
                self.reset_stream(positions[i])
            kwargs = dict(options[i]) if options is not None else {}
            if residuals is not None:
                kwargs["residual"] = residuals[i]
            payloads.append(self.encode(t, **kwargs))
        return payloads

    def decode_mean_stacked_many(self, stacked: Sequence[Payload], scale: float | None = None,
                                 outs: Optional[Sequence[Optional[torch.Tensor]]] = None) -> List[torch.Tensor]:
        """``[decode_mean_stacked(stacked[i], scale, out=outs[i])]`` of a bucket's tensors (one K
        for all); one bucket op where :meth:`bucket_ops` accepts them, bitwise the same results."""
        outs = outs if outs is not None else [None] * len(stacked)
        return [self.decode_mean_stacked(p, scale, out=o) for p, o in zip(stacked, outs)]

    def decode_mean_list_many(self, payloads: Sequence[Sequence[Payload]], scale: float | None = None,
                              outs: Optional[Sequence[Optional[torch.Tensor]]] = None) -> List[torch.Tensor]:
        """``[decode_mean_list(payloads[i], scale, out=outs[i])]`` of a bucket's tensors, each a list
        of K variable-size payloads; one bucket op where :meth:`bucket_ops` accepts them."""
        outs = outs if outs is not None else [None] * len(payloads)
        return [self.decode_mean_list(p, scale, out=o) for p, o in zip(payloads, outs)]

    def decode_many(self, payloads: Sequence[Payload],
                    outs: Optional[Sequence[Optional[torch.Tensor]]] = None) -> List[torch.Tensor]:
        """``[decode(payloads[i], out=outs[i])]`` of a bucket's single payloads (the two-phase
        results); one bucket op where :meth:`bucket_ops` accepts them, bitwise the same results."""
        outs = outs if outs is not None else [None] * len(payloads)
        return [self.decode(p, out=o) for p, o in zip(payloads, outs)]

    def encode_columns_many(self, windows: Sequence[Tuple[torch.Tensor, Optional[torch.Tensor], int, int]],
                            positions: Optional[Sequence[int]] = None,
                            scales: Optional[Sequence[torch.Tensor]] = None) -> List[Payload]:
        """``[encode_columns(tensor, residual, start, stop)]`` of each window, window i from stream
        position ``positions[i]``; one bucket op where :meth:`bucket_ops` accepts them.
        ``scales``: each window's measured scales, for a codec that measures (onebit), or None."""
        payloads = []
        for i, (tensor, residual, start, stop) in enumerate(windows):
            if positions is not None:
                self.reset_stream(positions[i])
            extra = {} if scales is None else {"scales": scales[i]}
            payloads.append(self.encode_columns(tensor, residual, start, stop, **extra))
        return payloads

    def decode_columns_many(self, windows: Sequence[Tuple[Payload, torch.Tensor, int]]) -> None:
        """``decode_columns(payload, out, start)`` of each window; one bucket op where
        :meth:`bucket_ops` accepts them."""
        for payload, out, start in windows:
            self.decode_columns(payload, out, start)

    def on_device_kernels(self, devices: Sequence[torch.device]) -> bool:
        """True when a bucket on ``devices`` (non-empty, one device) goes to the device kernels:
        impl "twin" with CPU tensors, impl "native" with CUDA tensors."""
        if not devices or not self.uses_kernels or any(d != devices[0] for d in devices):
            return False
        return torch.device(devices[0]).type == ("cpu" if self.impl == "twin" else "cuda")

    # -- shared -------------------------------------------------------------------
    def check_out(self, out: Optional[torch.Tensor], payload: Payload) -> Optional[torch.Tensor]:
        """Validate an ``out=`` tensor for ``payload``: contiguous, its shape, dtype and device."""
        if out is not None and (out.shape != payload.shape or out.dtype != payload.dtype
                                or out.device != payload.device or not out.is_contiguous()):
            raise ValueError(
                f"{self.name}: out must be a contiguous {tuple(payload.shape)} {payload.dtype} tensor on "
                f"{payload.device}, got {tuple(out.shape)} {out.dtype} on {out.device} "
                f"(contiguous={out.is_contiguous()})")
        return out

    def payload_nbytes(self, shape: Sequence[int], dtype: torch.dtype) -> int:
        return sum(numel * dt.itemsize for _, dt, numel in self.layout(shape, dtype))

    def decode_mean_stacked(self, stacked: Payload, scale: float | None = None,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``scale * sum_k decode(payload_k)`` of K payloads of one size, *stacked*: each
        buffer of ``stacked`` is ``[K, numel]`` (rows of one receive buffer, as the fixed-size
        exchanges get them). ``scale`` defaults to 1/K (the mean); written into ``out`` when
        given. See :meth:`decode_mean_list` for payloads of different sizes."""
        self.check_out(out, stacked)
        k = next(iter(stacked.buffers.values())).shape[0]
        scale = 1.0 / k if scale is None else scale
        acc = None
        for i in range(k):
            one = Payload({n: b[i] for n, b in stacked.buffers.items()}, stacked.shape, stacked.dtype, stacked.device)
            d = self.decode(one).to(torch.float64 if stacked.dtype == torch.float64 else torch.float32)
            acc = d if acc is None else acc.add_(d)
        if acc is None:
            raise ValueError(f"{self.name}: decode_mean_stacked needs at least one payload")
        result = acc.mul_(scale).to(stacked.dtype)
        return result if out is None else out.copy_(result)

    def flat_out(self, out: Optional[torch.Tensor], payload: Payload) -> Optional[torch.Tensor]:
        """``out`` validated by :meth:`check_out`, as the flat view native kernels write (or None)."""
        return None if self.check_out(out, payload) is None else out.view(-1)

    def reset_stream(self, position: int) -> None:
        """Move a stochastic codec's random stream to ``position`` (deterministic codecs have
        none: nothing to do). The adapter sets position ``step * P + i`` before encoding tensor
        i of P, so the random numbers do not depend on the order in which hooks fire."""

    def agreement_key(self) -> str:
        """The options every rank must share (the repr without per-rank ``rank_stream``)."""
        return re.sub(r"(, )?rank_stream=-?\d+", "", repr(self))

    def decode_mean_list(self, payloads: Sequence[Payload], scale: float | None = None,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``scale * sum_k decode(payloads[k])`` of a *list* of K payloads that may differ in
        size (variable-size codecs: DGC, QSGD's Elias coding); ``scale`` defaults to 1/K.
        See :meth:`decode_mean_stacked` for K payloads of one size stacked in one buffer."""
        first, k = check_payload_list(self.name, payloads)
        scale = 1.0 / k if scale is None else scale
        self.check_out(out, first)
        acc = torch.zeros(first.shape, dtype=torch.float64 if first.dtype == torch.float64 else torch.float32,
                          device=first.device)
        for p in payloads:
            acc.add_(self.decode(p))
        result = acc.mul_(scale).to(first.dtype)
        return result if out is None else out.copy_(result)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(impl={self.impl!r})"
