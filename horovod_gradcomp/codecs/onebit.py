"""1-bit quantization with two reconstruction values per row or per column (Seide et al., 2014).

For a tensor of shape ``[d0, d1, ...]`` viewed as ``G = v.view(d0, -1)`` (1-D and 0-d
tensors are one group), with ``v = g + r`` when an error-feedback residual ``r`` is given:

* bit ``b_i = 1`` where ``v_i >= 0`` (a NaN is encoded as negative);
* each group j (a row of ``G``, the default, or a column with ``scales="columns"``) gets two
  reconstruction values, ``a+_j`` = the mean of its entries ``>= 0`` and ``a-_j`` = the mean of
  its negative entries (0 for an empty side): the values that minimize the group's squared
  quantization error given the bits;
* decoding puts ``a+_j`` or ``a-_j`` back; the residual becomes ``v - decode(payload)``.

Wire format (what ``Payload.buffers`` holds, in this order):

* ``bits``: uint8[ceil(n/8)], flat row-major element i -> byte i//8, bit i%8, LSB first;
* ``scales``: float32[2*groups], ``a+`` of every group, then ``a-`` of every group.

So ``nbytes = ceil(n/8) + 8*groups`` (groups: ``d0`` rows, or ``prod(shape[1:])`` columns).
Scales are float32 whatever the gradient dtype (fp16/bf16/fp32/fp64 are accepted); the residual
is kept in the gradient's dtype and the arithmetic runs in float32 (float64 for fp64 gradients).

Groups (``scales``):

* ``"rows"`` (the default): the two values tied to each row of ``G`` (an output unit's fan-in;
  a convolution's output channel; an embedding's token). Row r's values are summed exactly as
  a one-column tensor of its ``prod(shape[1:])`` values is (bitwise the scales of encoding
  ``G[r]`` alone). Its two-phase stripes are rows (views).
* ``"columns"``: the paper's grouping, per column of the weight matrix (Seide et al.,
  docs/guide/codecs/onebit.md). Where the rows of a column differ in scale (PyTorch stacks an RNN's
  gates along dim 0; an output layer's rows are characters of very different frequency), a
  column's two means carry a small part of its energy, the residual grows to many times the
  gradient and training at a large step diverges: why rows are the default
  (docs/results/onebit_divergence.md). Its two-phase stripes are column windows.

Both run the same kernels at about the same cost (read and written in place, in order; no
copies); the bucket ops and :meth:`OneBitCodec.measure` apply to both.

No rescaling by default: what the exchange returns is the mean of the ranks' decoded payloads
at every step. ``lr_warmup_steps=N`` (opt-in, default 0) multiplies the averaged gradients of
step t < N by (t + 1) / N (:mod:`horovod_gradcomp.exchange.step_ramp`): a learning-rate warm-up
applied to the gradient, which changes what clipping, gradient-norm logging and a GradScaler
see. ``scales="columns"`` is the paper's method exactly.

``ramp_steps`` (the option's old name, whose default was 300 before the warm-up became opt-in) is
still taken, with a FutureWarning, and means ``lr_warmup_steps``. A checkpoint names the codec it was written
with (its repr): one written with the old default says ``ramp_steps=300`` and resumes only into
a compression built with ``lr_warmup_steps=300`` (the old spelling is read as the new one;
:func:`saved_codec_repr`), so resuming never drops or adds the warm-up silently.

The residual cap (``residual_cap=c``, opt-in, default 0: none): after each encode every group's
residual is scaled down to at most ``c`` times the norm of the same group of the gradient just
encoded (:mod:`horovod_gradcomp.codecs.residual_cap`); the payload, its bytes and the averaged
gradient are those of the uncapped encode (docs/results/onebit_schedule.md).
"""
from __future__ import annotations

import math
import re
import warnings
from typing import List, Optional, Sequence

import torch

from ..native import kernels_for
from .base import BufferSpec, Codec, Payload
from .bitpack import pack_bits, unpack_bits
from .dtypes import accumulation_dtype, check_float
from .payload_checks import check_fixed
from .registry import register_codec
from .residual_cap import cap_residual, cap_window, check_cap

def onebit_columns(shape: Sequence[int]) -> int:
    """Number of columns of the 2-D view ``[shape[0], prod(shape[1:])]`` (1 for 0-d/1-D)."""
    return 1 if len(shape) <= 1 else math.prod(shape[1:])


#: Where onebit's reconstruction values are tied: per row of the 2-D view (the default) or per
#: column (the spec).
SCALE_GROUPS = ("rows", "columns")

#: The defaults of :class:`OneBitCodec`'s ``scales`` and ``lr_warmup_steps``: rows (the char model
#: of examples/train.py diverges per column at its learning rate, docs/results/onebit_divergence.md)
#: and no warm-up (the exchange returns the codec's estimate of the mean, never rescaled).
DEFAULT_SCALES, DEFAULT_LR_WARMUP_STEPS = "rows", 0


def _step_count(option: str, value) -> int:
    """``value`` when it is a non-negative int (a count of steps); a ValueError naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"onebit: {option} must be a non-negative int, got {value!r}")
    return value


def saved_codec_repr(saved: str) -> str:
    """A checkpoint's codec repr in today's spelling: onebit's ``ramp_steps=N`` (the option's
    old name) becomes ``lr_warmup_steps=N``, the same option. Other reprs unchanged."""
    if not isinstance(saved, str) or not saved.startswith("OneBitCodec("):
        return saved
    return re.sub(r"\bramp_steps=", "lr_warmup_steps=", saved)


@register_codec("onebit")
class OneBitCodec(Codec):
    """1-bit sign quantizer with two means per row (default) or per column; fuses the
    error-feedback update."""

    fuses_feedback = True
    #: Two-phase from K = 3 (it sends fewer bytes): with the column windows it costs about the
    #: allgather's CPU, so it wins on slow links and stays ahead of fp16 on fast ones
    #: (docs/results/README.md, "Column windows").
    default_pattern = "auto"
    #: Under the Adam family: the first 100 steps averaged exactly (what hurts onebit under Adam
    #: is the start of training: docs/results/adam_table.md).
    adam_defaults = {"warmup_steps": 100}
    #: Under ``torch.optim.SGD``: the residual cap at 0.05 (each group's residual scaled down after
    #: the encode to at most 5% of its gradient's norm; payload and averaged gradient untouched).
    #: SGD's momentum already carries the past gradients; a residual that may grow to the
    #: gradient's size (the former cap, 1.0) adds stale signs on top, and at the dense learning
    #: rate the bench tta transformer's loss then rose from 2.2 to 6-7 in its first 20 steps and
    #: was still 29% above dense at step 75 (0.05: 7%, closing). The char model stays within 5% of
    #: dense (docs/results/defaults_check.md).
    sgd_defaults = {"residual_cap": 0.05}

    def __init__(self, impl: str = "native", warmup_steps: int = 0, scales: str = DEFAULT_SCALES,
                 lr_warmup_steps: int = DEFAULT_LR_WARMUP_STEPS, ramp_steps: Optional[int] = None,
                 residual_cap: float = 0.0):
        """``warmup_steps``: the exchange averages the first N steps of a compression at full
        precision (:mod:`horovod_gradcomp.exchange.dense`; residuals untouched, so error
        feedback starts from zero at step N); this codec's payloads from step N on.
        ``scales``: "rows" (the default) or "columns" (the spec; see the module doc).
        ``lr_warmup_steps`` (opt-in; default 0, none): the averaged gradients of step t < N are
        multiplied by (t + 1) / N (:mod:`horovod_gradcomp.exchange.step_ramp`): a learning-rate
        warm-up carried by the gradient itself, so clipping, logged norms and a GradScaler see the
        scaled gradient; payloads, residuals and bytes unchanged. Prefer the optimizer's own
        warm-up (a scheduler): it leaves the gradient alone.
        ``ramp_steps``: the old name of ``lr_warmup_steps`` (FutureWarning; giving both is a
        ValueError). It once defaulted to 300: see the module doc for checkpoints.
        ``residual_cap`` (opt-in; default 0, none): after each encode, each group's residual is
        scaled down to at most this many times the norm of the same group of the gradient
        (:mod:`.residual_cap`); payloads, bytes and the averaged gradient unchanged.
        The repr names ``scales`` and ``lr_warmup_steps`` where they differ from the paper's
        method (columns, no warm-up), so a checkpoint names exactly the compression that resumes it."""
        super().__init__(impl)
        if scales not in SCALE_GROUPS:
            raise ValueError(f"onebit: scales must be one of {SCALE_GROUPS}, got {scales!r}")
        self.warmup_steps, self.scales = _step_count("warmup_steps", warmup_steps), scales
        if ramp_steps is not None:
            if lr_warmup_steps != DEFAULT_LR_WARMUP_STEPS:
                raise ValueError("onebit: ramp_steps is the old name of lr_warmup_steps; give lr_warmup_steps only")
            warnings.warn("onebit: ramp_steps is now called lr_warmup_steps (it scales the averaged gradient: a "
                          "learning-rate warm-up) and defaults to 0; ramp_steps=N is read as lr_warmup_steps=N",
                          FutureWarning, stacklevel=3)
            lr_warmup_steps = _step_count("ramp_steps", ramp_steps)
        self.lr_warmup_steps = _step_count("lr_warmup_steps", lr_warmup_steps)
        self.residual_cap = check_cap("onebit", residual_cap)
        if impl != "reference":
            self._C = kernels_for(impl, self.name)

    def __repr__(self) -> str:
        extra = f", warmup_steps={self.warmup_steps}" if self.warmup_steps else ""
        extra += f", scales={self.scales!r}" if self.scales != "columns" else ""
        extra += f", lr_warmup_steps={self.lr_warmup_steps}" if self.lr_warmup_steps else ""
        extra += f", residual_cap={self.residual_cap!r}" if self.residual_cap else ""
        return f"{type(self).__name__}(impl={self.impl!r}{extra})"

    def _by_rows(self, shape: Sequence[int]) -> bool:
        """True where this codec ties its values to rows (rows mode, >= 2-D)."""
        return self.scales == "rows" and len(shape) >= 2

    def groups(self, shape: Sequence[int]) -> int:
        """Number of (a+, a-) pairs of a tensor of this shape: columns, or rows in rows mode."""
        return int(shape[0]) if self._by_rows(shape) else onebit_columns(shape)

    def _mode(self, shape: Sequence[int]):
        """``(groups, by_rows)`` of a tensor of this shape: what the kernels take as ``cols`` and
        ``by_rows`` (rows mode: ``cols`` counts the rows of the ``[d0, -1]`` view)."""
        return self.groups(shape), self._by_rows(shape)

    def _modes(self, shapes: Sequence[Sequence[int]]):
        """The bucket ops' per-tensor lists: ``(groups, by_rows)`` of tensors of these shapes."""
        modes = [self._mode(s) for s in shapes]
        return [g for g, _ in modes], [b for _, b in modes]

    # -- helpers ------------------------------------------------------------------
    def _check(self, tensor: torch.Tensor, residual: Optional[torch.Tensor]) -> None:
        check_float("onebit", tensor)
        if residual is not None:
            if residual.shape != tensor.shape or residual.dtype != tensor.dtype or residual.device != tensor.device:
                raise ValueError(
                    f"onebit: residual {tuple(residual.shape)}/{residual.dtype}/{residual.device} does not match "
                    f"gradient {tuple(tensor.shape)}/{tensor.dtype}/{tensor.device}")
            if not residual.is_contiguous():
                raise ValueError("onebit: the residual is updated in place and must be contiguous")

    def layout(self, shape: Sequence[int], dtype: torch.dtype) -> List[BufferSpec]:
        n = math.prod(shape)
        return [("bits", torch.uint8, (n + 7) // 8), ("scales", torch.float32, 2 * self.groups(shape))]

    # -- measure: the encode's first pass alone ------------------------------------
    #: :meth:`measure` runs (either mode): the exchange takes its non-finite check from the
    #: scales before its preamble and encodes with them after it.
    measures = True

    def measure(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The scales (float32[2*groups]) that ``encode(tensor, residual)`` puts in its payload, from
        the encode's first pass alone: nothing is written (the residual is read). ``encode(...,
        scales=measure(...))`` then gives bitwise the payload and residual of ``encode(...)``.

        Non-finite input shows in them: a NaN in column j (rows mode: row j) of ``v = g + r`` makes
        ``a-_j`` NaN (a NaN counts as negative), a +Inf makes ``a+_j`` +Inf, a -Inf ``a-_j`` -Inf; a
        finite ``v`` gives a non-finite scale only past float32's range."""
        return self.measure_many([tensor], None if residual is None else [residual])[0]

    def measure_many(self, tensors: Sequence[torch.Tensor],
                     residuals: Optional[Sequence[Optional[torch.Tensor]]] = None) -> List[torch.Tensor]:
        """:meth:`measure` of each tensor (``residuals[i]`` None: no residual); one bucket op
        (at most 4 device calls per dtype) where :meth:`bucket_ops` accepts the tensors."""
        tensors = list(tensors)
        residuals = list(residuals) if residuals is not None else [None] * len(tensors)
        for t, r in zip(tensors, residuals):
            self._check(t, r)
        groups, rows = self._modes([t.shape for t in tensors])
        flats = [t.reshape(-1).contiguous() for t in tensors]
        res = [None if r is None else r.view(-1) for r in residuals]
        if not self.uses_kernels:
            return [self._reference_scales(f, r, c, b)[2] for f, r, c, b in zip(flats, res, groups, rows)]
        uniform = all(r is None for r in res) or all(r is not None for r in res)
        if uniform and len({t.device for t in tensors}) <= 1:  # one call (device tensors: one bucket op)
            return list(self._C.onebit_scales_many(flats, None if res and res[0] is None else res, groups, rows))
        return [self._C.onebit_scales(f, r, c, b) for f, r, c, b in zip(flats, res, groups, rows)]

    @staticmethod
    def window_scales(scales: torch.Tensor, cols: int, start: int, stop: int) -> torch.Tensor:
        """The scales of columns ``[start, stop)`` out of a ``cols``-column tensor's ``scales``
        (``a+`` of the window, then ``a-``): what :meth:`encode_columns` of that window computes
        (each column is summed alone, in the same order, whatever the window)."""
        return torch.cat([scales[start:stop], scales[cols + start:cols + stop]])

    # -- encode -------------------------------------------------------------------
    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None,
               scales: Optional[torch.Tensor] = None) -> Payload:
        """Encode ``tensor`` (+ ``residual``, updated in place to the new quantization error).
        ``scales``: :meth:`measure` of the same tensor and residual: the second pass alone, bitwise
        the same payload and residual (the payload holds ``scales`` itself)."""
        self._check(tensor, residual)
        groups, by_rows = self._mode(tensor.shape)
        flat = tensor.reshape(-1)
        if self.uses_kernels:
            res = residual.view(-1) if residual is not None else None
            bits, scales = self._C.onebit_encode(flat.contiguous(), res, groups, scales, by_rows)
        else:
            bits, scales = self._reference_encode(flat, residual, groups, by_rows, scales)
        if residual is not None:
            cap_residual(residual, tensor, self.residual_cap, groups, by_rows)
        return Payload({"bits": bits, "scales": scales}, tensor.shape, tensor.dtype, tensor.device)

    @staticmethod
    def _grid(values: torch.Tensor, groups: int, by_rows: bool) -> torch.Tensor:
        """The flat ``values`` as the 2-D view whose columns (``by_rows``: rows) are the ``groups``."""
        other = values.numel() // groups if groups else 0
        return values.view(groups, other) if by_rows else values.view(other, groups)

    @classmethod
    def _reference_scales(cls, flat: torch.Tensor, residual: Optional[torch.Tensor], groups: int,
                          by_rows: bool = False):
        """``(grid, pos, scales)``: ``v = flat (+ residual)`` as the 2-D view (:meth:`_grid`) in the
        arithmetic dtype, its signs, and the groups' float32 scales (the reference's first pass)."""
        acc = accumulation_dtype(flat.dtype)
        v = flat.to(acc)
        if residual is not None:
            v = v + residual.reshape(-1).to(acc)
        grid = cls._grid(v, groups, by_rows)
        dim = 1 if by_rows else 0  # the axis each group sums over
        pos = grid >= 0
        n_pos = pos.sum(dim).to(acc)
        n_neg = grid.shape[dim] - n_pos
        zero = torch.zeros((), dtype=acc, device=v.device)
        a_pos = torch.where(n_pos > 0, torch.where(pos, grid, zero).sum(dim) / n_pos.clamp(min=1), zero)
        a_neg = torch.where(n_neg > 0, torch.where(pos, zero, grid).sum(dim) / n_neg.clamp(min=1), zero)
        return grid, pos, torch.cat([a_pos, a_neg]).to(torch.float32)

    @staticmethod
    def _reference_values(pos: torch.Tensor, scales: torch.Tensor, groups: int, by_rows: bool,
                          dtype: torch.dtype) -> torch.Tensor:
        """``a+`` or ``a-`` of each value's group per the signs ``pos`` (the :meth:`_grid` view), in ``dtype``."""
        sent = scales.to(dtype).view(2, groups)
        if by_rows:
            sent = sent.unsqueeze(2)
        return torch.where(pos, sent[0], sent[1])

    @classmethod
    def _reference_encode(cls, flat: torch.Tensor, residual: Optional[torch.Tensor], groups: int,
                          by_rows: bool = False, given: Optional[torch.Tensor] = None):
        acc = accumulation_dtype(flat.dtype)
        grid, pos, scales = cls._reference_scales(flat, residual, groups, by_rows)
        if given is not None:
            if given.dtype != torch.float32 or given.numel() != 2 * groups or given.device != flat.device:
                raise ValueError(f"onebit_encode: the given scales must be a float32 tensor of 2 * {groups} values "
                                 f"on {flat.device}, got {given.numel()} {given.dtype} values on {given.device}")
            scales = given
        if residual is not None:
            residual.copy_((grid - cls._reference_values(pos, scales, groups, by_rows, acc)).view(residual.shape))
        return pack_bits(pos), scales

    # -- a bucket at once ----------------------------------------------------------
    def bucket_ops(self, devices: Sequence[torch.device]) -> bool:
        """The device kernels' bucket ops (``onebit_encode_many``, ``onebit_decode_sum_many``:
        at most 5 and 1 device calls per dtype), in either mode."""
        return self.on_device_kernels(devices)

    def encode_many(self, tensors, residuals=None, options=None, positions=None) -> List[Payload]:
        """See :meth:`Codec.encode_many` (onebit is deterministic: positions are not used);
        ``options[i]`` may give tensor i's ``scales`` (:meth:`measure`), for every tensor or none."""
        if not self.bucket_ops([t.device for t in tensors]):
            return super().encode_many(tensors, residuals, options, positions)
        for i, t in enumerate(tensors):
            self._check(t, residuals[i] if residuals is not None else None)
        given = self._given_scales(options, len(tensors))
        flats = [t.reshape(-1).contiguous() for t in tensors]
        res = [r.view(-1) for r in residuals] if residuals is not None else None
        groups, rows = self._modes([t.shape for t in tensors])
        bits, scales = self._C.onebit_encode_many(flats, res, groups, given, rows)
        if res is not None:
            for t, r, g, b in zip(tensors, residuals, groups, rows):
                cap_residual(r, t, self.residual_cap, g, b)
        return [Payload({"bits": b, "scales": s}, t.shape, t.dtype, t.device) for b, s, t in zip(bits, scales, tensors)]

    @staticmethod
    def _given_scales(options: Optional[Sequence[dict]], count: int) -> Optional[List[torch.Tensor]]:
        """Each tensor's ``scales`` from its encode options, or None when no tensor has them.
        Checked: one dict per tensor, no option but ``scales``, given for every tensor or none."""
        if options is None:
            return None
        if len(options) != count:
            raise ValueError(f"onebit: {count} tensors but {len(options)} encode options")
        unknown = sorted({k for o in options for k in o} - {"scales"})
        if unknown:
            raise TypeError(f"onebit: encode got unexpected options {unknown}")
        given = [o.get("scales") for o in options]
        if all(g is None for g in given):
            return None
        if any(g is None for g in given):
            raise ValueError("onebit: a bucket's encode options give scales for every tensor or for none")
        return given

    def decode_mean_stacked_many(self, stacked, scale=None, outs=None) -> List[torch.Tensor]:
        """See :meth:`Codec.decode_mean_stacked_many`."""
        outs = list(outs) if outs is not None else [None] * len(stacked)
        if not self.bucket_ops([p.device for p in stacked]):
            return super().decode_mean_stacked_many(stacked, scale, outs)
        ks = {check_fixed(self, p, stacked=True) for p in stacked}
        if len(ks) != 1:
            raise ValueError(f"onebit: a bucket's payloads come from one K ranks, got K = {sorted(ks)}")
        scale = 1.0 / ks.pop() if scale is None else scale
        flat_outs = [self.flat_out(o, p) for o, p in zip(outs, stacked)]
        groups, rows = self._modes([p.shape for p in stacked])
        flats = self._C.onebit_decode_sum_many(
            [p.buffers["bits"] for p in stacked], [p.buffers["scales"] for p in stacked], [p.numel for p in stacked],
            groups, [p.dtype for p in stacked], float(scale), flat_outs, rows)
        return [f.view(p.shape) if o is None else o for f, p, o in zip(flats, stacked, outs)]

    def decode_many(self, payloads, outs=None) -> List[torch.Tensor]:
        """See :meth:`Codec.decode_many`: one payload each, decode-sum with K = 1 and scale 1 (what
        :meth:`decode` runs)."""
        if not self.bucket_ops([p.device for p in payloads]):
            return super().decode_many(payloads, outs)
        stacked = [Payload({k: v.unsqueeze(0) for k, v in p.buffers.items()}, p.shape, p.dtype, p.device)
                   for p in payloads]
        return self.decode_mean_stacked_many(stacked, 1.0, outs)

    def encode_columns_many(self, windows, positions=None, scales=None) -> List[Payload]:
        """See :meth:`Codec.encode_columns_many` (deterministic: positions are not used);
        ``scales[i]``: window i's scales (:meth:`window_scales` of the tensor's :meth:`measure`),
        for every window or None."""
        if scales is not None and any(s is None for s in scales):
            raise ValueError("onebit: give scales for every window or for none")
        if not self.bucket_ops([t.device for t, _, _, _ in windows]):
            return super().encode_columns_many(windows, positions, scales)
        cols = []
        for tensor, residual, start, stop in windows:
            self._check(tensor, residual)
            cols.append(self._window(tensor, start, stop))
        residuals = [r for _, r, _, _ in windows]
        if any(r is None for r in residuals) and any(r is not None for r in residuals):
            raise ValueError("onebit: a bucket's windows have a residual each or none")
        bits, scales = self._C.onebit_encode_columns_many(
            [t for t, _, _, _ in windows], None if residuals and residuals[0] is None else residuals, cols,
            [w[2] for w in windows], [w[3] for w in windows], None if scales is None else list(scales))
        for (tensor, residual, start, stop), c in zip(windows, cols):
            if residual is not None:
                cap_window(residual, tensor, self.residual_cap, c, start, stop)
        return [Payload({"bits": b, "scales": s}, torch.Size((t.shape[0], stop - start)), t.dtype, t.device)
                for b, s, (t, _, start, stop) in zip(bits, scales, windows)]

    def decode_columns_many(self, windows) -> None:
        """See :meth:`Codec.decode_columns_many`."""
        if not self.bucket_ops([out.device for _, out, _ in windows]):
            return super().decode_columns_many(windows)
        full_cols, col0, col1 = [], [], []
        for payload, out, start in windows:
            check_fixed(self, payload)
            width = onebit_columns(payload.shape)
            full_cols.append(self._window(out, start, start + width))
            if out.dtype != payload.dtype or payload.numel != out.shape[0] * width:
                raise ValueError(f"onebit: a {tuple(payload.shape)} {payload.dtype} payload does not fit columns "
                                 f"[{start}, {start + width}) of a {tuple(out.shape)} {out.dtype} tensor")
            col0.append(start)
            col1.append(start + width)
        self._C.onebit_decode_columns_many([p.buffers["bits"] for p, _, _ in windows],
                                           [p.buffers["scales"] for p, _, _ in windows],
                                           [out for _, out, _ in windows], full_cols, col0, col1)

    # -- column windows (two-phase column stripes without copies) -------------------
    def encodes_column_windows(self, tensor: torch.Tensor, width: int) -> bool:
        """The kernels (native: CPU and CUDA tensors; twin: CPU tensors) read and write a window of
        >= 2 columns of a contiguous >= 2-D tensor in place; the reference impl does not."""
        devices = ("cpu", "cuda") if self.impl == "native" else ("cpu",)
        return (self.scales == "columns" and self.uses_kernels and tensor.device.type in devices and tensor.dim() >= 2 and width >= 2
                and tensor.is_contiguous())

    def _window(self, tensor: torch.Tensor, start: int, stop: int) -> int:
        cols = onebit_columns(tensor.shape)
        if not self.encodes_column_windows(tensor, stop - start) or start < 0 or stop > cols:
            raise ValueError(f"onebit: no column-window kernel for a {tuple(tensor.shape)} {tensor.dtype} tensor on "
                             f"{tensor.device} (contiguous={tensor.is_contiguous()}), window [{start}, {stop}): "
                             f"native or twin impl, >= 2-D, contiguous, 2 or more of its {cols} columns")
        return cols

    def encode_columns(self, tensor: torch.Tensor, residual: Optional[torch.Tensor], start: int,
                       stop: int, scales: Optional[torch.Tensor] = None) -> Payload:
        """See :meth:`Codec.encode_columns`; bitwise the payload and residual of ``encode``
        of the window's contiguous copy (the kernel sums in the same order). ``scales``: the
        window's (:meth:`window_scales` of :meth:`measure`): the second pass alone."""
        self._check(tensor, residual)
        cols = self._window(tensor, start, stop)
        bits, scales = self._C.onebit_encode_columns(tensor, residual, cols, start, stop, scales)
        if residual is not None:
            cap_window(residual, tensor, self.residual_cap, cols, start, stop)
        return Payload({"bits": bits, "scales": scales}, torch.Size((tensor.shape[0], stop - start)), tensor.dtype,
                       tensor.device)

    def decode_columns(self, payload: Payload, out: torch.Tensor, start: int) -> None:
        check_fixed(self, payload)
        width = onebit_columns(payload.shape)
        cols = self._window(out, start, start + width)
        if out.dtype != payload.dtype or payload.numel != out.shape[0] * width:
            raise ValueError(f"onebit: a {tuple(payload.shape)} {payload.dtype} payload does not fit columns "
                             f"[{start}, {start + width}) of a {tuple(out.shape)} {out.dtype} tensor")
        self._C.onebit_decode_columns(payload.buffers["bits"], payload.buffers["scales"], out, cols, start,
                                      start + width)

    # -- decode -------------------------------------------------------------------
    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Tensor of the payload's shape and dtype holding a+_j / a-_j per the bits (j: the value's
        column, or row in rows mode; written into ``out`` when given: contiguous, same shape and dtype)."""
        check_fixed(self, payload)
        n, (groups, by_rows) = payload.numel, self._mode(payload.shape)
        bits, scales = payload.buffers["bits"], payload.buffers["scales"]
        if self.uses_kernels:
            flat = self._C.onebit_decode(bits, scales, n, groups, payload.dtype, self.flat_out(out, payload), by_rows)
            return flat.view(payload.shape) if out is None else out
        self.check_out(out, payload)
        pos = self._grid(unpack_bits(bits, n), groups, by_rows)
        flat = self._reference_values(pos, scales, groups, by_rows, accumulation_dtype(payload.dtype)).to(payload.dtype)
        if out is not None:
            return out.copy_(flat.view(payload.shape))
        return flat.view(payload.shape)

    def decode_mean_stacked(self, stacked: Payload, scale: float | None = None,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``scale * sum_k decode(payload_k)`` in one pass over the K payloads (no K dense
        intermediates); ``scale`` defaults to 1/K. Written into ``out`` when given."""
        k = check_fixed(self, stacked, stacked=True)
        if not self.uses_kernels:
            return super().decode_mean_stacked(stacked, scale, out)
        bits, scales = stacked.buffers["bits"], stacked.buffers["scales"]
        scale = 1.0 / k if scale is None else scale
        groups, by_rows = self._mode(stacked.shape)
        flat = self._C.onebit_decode_sum(bits, scales, stacked.numel, groups, stacked.dtype, float(scale),
                                         self.flat_out(out, stacked), by_rows)
        return flat.view(stacked.shape) if out is None else out
