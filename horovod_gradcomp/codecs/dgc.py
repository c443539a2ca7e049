"""DGC sparsification (Lin et al., ICLR 2018): send the largest-magnitude values only.

This codec only *selects and packs*; momentum correction, local clipping, momentum factor
masking and the density warm-up are state of the caller (the adapter), which encodes the
accumulated velocity ``v`` and masks ``v``/``u`` at the indices the payload carries.

Target count: ``k = target_count(n, density) = max(1, ceil(density * n))`` for ``n > 0``
(``density * n`` in float64, rounded down when it lies within 1e-9 relative of an integer,
so that 0.1 * 30 gives 3, not 4).

Selection (``select``); the selected set is always ``{i : |v_i| >= t}`` for a threshold
``t > 0`` (so zeros are never sent: an all-zero tensor, or a rank with nothing to send,
gives an empty payload), with NaN treated as larger than +inf (a NaN is always sent, so a
divergence shows on every rank instead of hiding in a residual). Ties at ``t`` are all
selected.

* ``impl="native"`` (CPU kernels; on CUDA tensors the device kernels, which ``impl="twin"``
  runs on the CPU: the same thresholds, paths and payloads, bit for bit): magnitudes are
  compared as integer keys (the bits without the sign). With ``m = min(n, max(ceil(sample * n), 512, ceil(32 / density)))`` samples (at
  least 32 expected above the threshold), when ``8 * m < n``: draw ``m`` indices with
  replacement from the counter-based stream (sample ``j`` reads index
  ``floor(h_j * n / 2^64)``, ``h_j = mix(K + (j + 1) * G)``, ``K`` the call's
  :func:`~horovod_gradcomp.codecs.streams.stream_key`), take ``t0`` = the
  ``ceil(k * m / n)``-th largest sampled magnitude and count ``c0 = #{|v| >= t0}``.

  - ``k/2 <= c0 <= 2k``: ``t = t0`` (path 0: the count is within 2x of ``k``);
  - ``c0 > 2k``: ``t`` = the exact k-th largest among the ``c0`` candidates (path 1);
  - ``c0 < k/2``: exact selection (path 2).

  Otherwise (small tensors, ``k >= n``) exact selection (path 2): ``t`` = the k-th
  largest magnitude (``nth_element``), or the smallest positive value when at most ``k``
  values are nonzero. So the count is within ``[k/2, 2k]``, or exactly
  ``min(k, nnz)`` up to ties at ``t``. Output indices ascend.
* ``impl="reference"``: ``torch.topk(|v|, k)`` (exact; any device), minus zero values,
  indices sorted ascending; ``t`` = the smallest selected magnitude (``inf`` if none).
  With ties at the k-th magnitude it keeps exactly ``k`` (topk's pick among the tied).

``density == 1`` selects every nonzero value: ``decode(encode(v)) == v`` exactly.

Wire format (``Payload.buffers``, in this order; ``variable_size = True``, ``c`` = count):
``indices`` uint8[w * c], the compact code of the strictly increasing indices, with the
narrowest ``w`` that holds every gap: ``w = 1`` or ``2``: the gap codes ``idx_j - idx_{j-1} - 1``
(``idx_{-1} = -1``) as little-endian uint8 / uint16 (every gap <= 256 / 65536); else the
indices themselves, little-endian int32 (``w = 4``, ``n < 2^31``) or int64 (``w = 8``). The
receiver reads ``w`` from the buffer's length and ``c`` from the values'. ``values`` [c] in
the gradient's dtype (lossless). ``nbytes = c * w + c * itemsize``; ``layout`` raises.
At density 0.001 the gaps average about 1000, so nearly every tensor sends 2 bytes per
index (6 per pair in fp32 instead of 8); during a warm-up at density >= 1/256, 1 byte.
Varint or Elias gap codes would save a little more at the cost of a sequential,
branchy decode; fixed widths keep both directions one simple pass.
:meth:`DGCCodec.indices_of` returns a payload's indices.

Decoding: ``decode`` scatters into zeros; ``decode_mean_list(payloads, scale, out)`` returns
``scale * sum_k scatter(payload_k)`` in one pass (native: parallel over output chunks,
float32 accumulation, float64 for fp64, ranks in order, then one rounding to the dtype:
the same numbers as the base class's loop).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from ..native import kernels_for, require_native_device
from .base import BufferSpec, Codec, Payload
from .dtypes import check_float
from .payload_checks import check_buffers, check_payload_list
from .registry import register_codec
from .streams import CounterStream, stream_key

#: Gradient dtypes whose momentum correction runs in the native one-pass kernel (CPU).
NATIVE_ACCUMULATE_DTYPES = (torch.float32, torch.float64)
MIN_SAMPLES = 512
MIN_SAMPLED_ABOVE = 32
EXACT_RATIO = 8


def target_count(n: int, density: float) -> int:
    """``k = max(1, ceil(density * n))`` for n > 0 (0 for n == 0), robust to float round-off."""
    if n <= 0:
        return 0
    x = density * n
    r = round(x)
    k = r if abs(x - r) <= 1e-9 * max(1.0, x) else math.ceil(x)
    return int(min(n, max(1, k)))


def sample_count(n: int, density: float, sample: float) -> int:
    """Number of values the native selection samples (0: exact selection)."""
    if n <= 0 or target_count(n, density) >= n:
        return 0
    m = min(n, max(math.ceil(sample * n), MIN_SAMPLES, math.ceil(MIN_SAMPLED_ABOVE / density)))
    return m if EXACT_RATIO * m < n else 0


def index_dtype(n: int) -> torch.dtype:
    return torch.int32 if n < (1 << 31) else torch.int64


def density_for_mean(density: float, ranks: int) -> float:
    """The density at which to select from a mean of ``ranks`` ranks' gradients (the hierarchical
    exchange's node mean of L ranks) so that up to as many values move per step as when each of
    the ranks selects at ``density`` itself (the flat exchange): ``min(1, ranks * density)``.
    ``ranks`` must be an int >= 1 (1: ``density`` unchanged)."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"dgc: the ranks a node mean is taken over must be an int >= 1, got {ranks!r}")
    return min(1.0, ranks * _check_fraction("density", density))


#: With no density given, DGC sends at least this many values per rank and step:
#: :func:`density_floor`. The paper's models send 1,700 (ResNet-110, 1.7 M parameters) to 66,000
#: values per step at density 0.001; a 115,431-parameter model sends 115 there and ended 7.5-15%
#: above dense, and 1,024 (density 0.0089) ended level with dense (docs/results/fsdp_accuracy.md).
DEFAULT_MIN_VALUES = 1024


def density_floor(values: int, min_values: int = DEFAULT_MIN_VALUES) -> float:
    """The smallest default density at which one rank's ``values`` gradient values per step yield
    ``min_values`` selected ones: ``min(1, min_values / values)`` (0 for ``values == 0``). A model
    of over a million values keeps the paper's 0.001."""
    if isinstance(values, bool) or not isinstance(values, int) or values < 0:
        raise ValueError(f"dgc: the number of values per step must be an int >= 0, got {values!r}")
    return min(1.0, min_values / values) if values else 0.0


def _check_fraction(name: str, val) -> float:
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not (0.0 < float(val) <= 1.0):
        raise ValueError(f"dgc: {name} must be a number in (0, 1], got {val!r}")
    return float(val)


@register_codec("dgc")
class DGCCodec(CounterStream, Codec):
    """DGC top-magnitude sparsifier: (indices, values) of about ``density * n`` values."""

    fuses_feedback = False
    error_feedback_default = False
    DEFAULT_DENSITY = 0.001
    #: Under the Adam family: density 0.1 (Adam normalizes each coordinate; at 0.001 a coordinate
    #: arrives rarely and as one large value, +47-60% test loss on the char model).
    adam_defaults = {"density": 0.1}
    variable_size = True

    def __init__(self, impl: str = "native", density: float = DEFAULT_DENSITY, sample: float = 0.01, seed: int = 0,
                 rank_stream: int = 0):
        super().__init__(impl)
        self.density = _check_fraction("density", density)
        self.sample = _check_fraction("sample", sample)
        for name, val in (("seed", seed), ("rank_stream", rank_stream)):
            if isinstance(val, bool) or not isinstance(val, int):
                raise ValueError(f"dgc: {name} must be an int, got {val!r}")
        self.seed = seed
        self.rank_stream = rank_stream
        self.counter = 0
        #: threshold and path (0/1/2, see the module doc; -1 for the reference) of the last selection
        self.last_threshold: float = math.inf
        self.last_path: int = -1
        if impl != "reference":
            self._C = kernels_for(impl, self.name)

    def __repr__(self) -> str:
        return (f"DGCCodec(impl={self.impl!r}, density={self.density!r}, sample={self.sample!r}, "
                f"seed={self.seed}, rank_stream={self.rank_stream})")

    def layout(self, shape: Sequence[int], dtype: torch.dtype) -> List[BufferSpec]:
        raise NotImplementedError(
            "dgc: payloads have variable size (variable_size=True): there is no fixed layout; exchange the "
            "counts, then the (indices, values) buffers")

    def target_count(self, n: int) -> int:
        return target_count(n, self.density)

    # -- selection ------------------------------------------------------------------
    def select(self, tensor: torch.Tensor, return_threshold: bool = False, density: Optional[float] = None):
        """``(indices, values)`` of the selected entries of ``tensor.reshape(-1)``
        (indices ascending, int32 when numel < 2^31 else int64; values in the tensor's
        dtype); with ``return_threshold=True`` also ``t`` (float): the set is ``{|v| >= t}``.
        ``density`` overrides the codec's own for this call (DGC's warm-up)."""
        check_float("dgc", tensor)
        density = self.density if density is None else _check_fraction("density", density)
        key = stream_key(self.seed, self.rank_stream, self.next_position())
        flat = tensor.reshape(-1)
        n = flat.numel()
        k = target_count(n, density)
        if self.uses_kernels:
            if self.impl == "native":
                require_native_device(tensor.device, "dgc")
            idx, vals, t, path = self._C.dgc_select(flat.contiguous(), k, sample_count(n, density, self.sample), key)
        else:
            idx, vals, t = reference_select(flat, k)
            path = -1
        self.last_threshold, self.last_path = float(t), int(path)
        return (idx, vals, float(t)) if return_threshold else (idx, vals)

    # -- encode / decode --------------------------------------------------------------
    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None,
               density: Optional[float] = None) -> Payload:
        if residual is not None:
            raise ValueError("dgc: the codec keeps no state (fuses_feedback=False); DGCMemory holds DGC's "
                             "momentum and accumulation: pass residual=None")
        return self.encode_with_indices(tensor, density)[0]

    def encode_with_indices(self, tensor: torch.Tensor,
                            density: Optional[float] = None) -> Tuple[Payload, torch.Tensor]:
        """``(encode(tensor), the selected flat indices)``: the indices as selected, without
        decoding them back from the payload's index code (for the caller's masking)."""
        idx, vals = self.select(tensor, density=density)
        n = tensor.numel()
        if self.uses_kernels:
            code = self._C.dgc_index_encode(idx, n)
        else:
            code = reference_index_encode(idx, n)
        return Payload({"indices": code, "values": vals}, tensor.shape, tensor.dtype, tensor.device), idx

    def accumulate_(self, u: torch.Tensor, v: torch.Tensor, g: torch.Tensor, momentum: float, nesterov: bool,
                    coef: float = 1.0) -> None:
        """DGC's momentum correction in place: ``u <- m u + c g``; ``v <- v + u`` (nesterov:
        ``v <- v + c g + m u``). One kernel pass for fp32/fp64 tensors where
        :func:`accumulate_in_kernels` says so, torch ops otherwise; both round every product and
        sum separately, so they agree bitwise."""
        if accumulate_in_kernels(self.impl, g.device.type, g.dtype, lambda: self._C.has_cuda()):
            self._C.dgc_accumulate_(u, v, g.contiguous(), momentum, nesterov, coef)
            return
        g = g if coef == 1.0 else g * coef
        u.mul_(momentum).add_(g)
        if nesterov:
            v.add_(g).add_(u * momentum)
        else:
            v.add_(u)

    def indices_of(self, payload: Payload) -> torch.Tensor:
        """The flat indices a payload carries, decoded from its index code: int32 (int64 when
        numel >= 2^31), strictly increasing (checked)."""
        self._check_payload(payload)
        code, count = payload.buffers["indices"], payload.buffers["values"].numel()
        if self.uses_kernels:
            return self._C.dgc_index_decode(code, count, payload.numel)
        return reference_index_decode(code, count, payload.numel)

    def selected_indices(self, payload: Payload) -> torch.Tensor:
        """int64 flat indices a payload carries (for momentum factor masking)."""
        return self.indices_of(payload).long()

    def _check_payload(self, payload: Payload) -> None:
        """An index code uint8[w*c] and values [c] of the payload's dtype, on its device (the
        code's length against c, and the indices, are checked as the code is decoded)."""
        check_buffers(self.name, payload, [("indices", torch.uint8, None), ("values", payload.dtype, None)])

    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.decode_mean_list([payload], 1.0, out)

    def decode_mean_list(self, payloads: Sequence[Payload], scale: float | None = None,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``scale * sum_k decode(payloads[k])`` (``scale`` defaults to 1/K) in one pass."""
        first, _ = check_payload_list(self.name, payloads)  # buffers: checked by indices_of below
        scale = 1.0 / len(payloads) if scale is None else float(scale)
        indices = [self.indices_of(p) for p in payloads]
        if self.uses_kernels:
            flat = self._C.dgc_scatter_sum(indices,
                                           [p.buffers["values"] for p in payloads], first.numel, first.dtype,
                                           scale, self.flat_out(out, first))
            return flat.view(first.shape) if out is None else out
        self.check_out(out, first)
        acc_dt = torch.float64 if first.dtype == torch.float64 else torch.float32
        acc = torch.zeros(first.numel, dtype=acc_dt, device=first.device)
        for idx, p in zip(indices, payloads):
            acc.index_add_(0, idx.long(), p.buffers["values"].to(acc_dt))
        flat = acc.mul_(scale).to(first.dtype).view(first.shape)
        return flat if out is None else out.copy_(flat)

    # -- a bucket at once (the device kernels' bucket ops) ---------------------------------
    def bucket_ops(self, devices: Sequence[torch.device]) -> bool:
        """The device kernels' bucket ops: ``dgc_select_many`` + ``dgc_index_encode_many`` (a
        bucket's selection and index coding), ``dgc_decode_sum_many`` (a bucket's decode-mean),
        ``dgc_accumulate_many_`` (momentum correction) and ``dgc_mask_many_`` (the sent entries'
        masking), each a fixed number of device calls whatever the bucket's tensor count."""
        return self.on_device_kernels(devices)

    def encode_many_with_indices(self, tensors: Sequence[torch.Tensor], density: Optional[float] = None,
                                 positions: Optional[Sequence[int]] = None
                                 ) -> Tuple[List[Payload], List[torch.Tensor]]:
        """``[encode_with_indices(tensors[i], density)]`` as two lists (payloads, selected indices),
        tensor i from stream position ``positions[i]`` (None: from the current position on), bitwise
        the per-tensor calls (``last_threshold`` / ``last_path``: the last tensor's). On the device
        kernels one bucket selection (``dgc_select_many``: a fixed number of device calls, one
        read-back of the counts, two when an estimate is off by more than 2x) and one bucket index
        coding (``dgc_index_encode_many``: three device calls, one read-back)."""
        if positions is not None and len(positions) != len(tensors):
            raise ValueError(f"dgc: {len(tensors)} tensors but {len(positions)} stream positions")
        if not tensors or not self.bucket_ops([t.device for t in tensors]):
            payloads, sent = [], []
            for i, t in enumerate(tensors):
                if positions is not None:
                    self.reset_stream(positions[i])
                payload, idx = self.encode_with_indices(t, density)
                payloads.append(payload)
                sent.append(idx)
            return payloads, sent
        for t in tensors:
            check_float("dgc", t)
        density = self.density if density is None else _check_fraction("density", density)
        keys = []
        for i in range(len(tensors)):
            if positions is not None:
                self.reset_stream(positions[i])
            keys.append(stream_key(self.seed, self.rank_stream, self.next_position()))
        flats = [t.reshape(-1).contiguous() for t in tensors]
        ns = [f.numel() for f in flats]
        idx, vals, ts, paths = self._C.dgc_select_many(flats, [target_count(n, density) for n in ns],
                                                       [sample_count(n, density, self.sample) for n in ns], keys)
        self.last_threshold, self.last_path = float(ts[-1]), int(paths[-1])
        codes = self._C.dgc_index_encode_many(idx, ns)
        payloads = [Payload({"indices": c, "values": v}, t.shape, t.dtype, t.device)
                    for c, v, t in zip(codes, vals, tensors)]
        return payloads, list(idx)

    def encode_many(self, tensors: Sequence[torch.Tensor], residuals: Optional[Sequence[torch.Tensor]] = None,
                    options: Optional[Sequence[dict]] = None,
                    positions: Optional[Sequence[int]] = None) -> List[Payload]:
        """See :meth:`Codec.encode_many`; on the device kernels (no residuals, one density for the
        bucket) :meth:`encode_many_with_indices`'s bucket ops."""
        densities = {tuple(sorted(o.items())) for o in options} if options is not None else {()}
        if (residuals is None and tensors and len(densities) == 1 and self.bucket_ops([t.device for t in tensors])):
            opts = dict(next(iter(densities)))
            if set(opts) <= {"density"}:
                return self.encode_many_with_indices(tensors, opts.get("density"), positions)[0]
        return super().encode_many(tensors, residuals, options, positions)

    def decode_mean_list_many(self, payloads: Sequence[Sequence[Payload]], scale: float | None = None,
                              outs: Optional[Sequence[Optional[torch.Tensor]]] = None) -> List[torch.Tensor]:
        """See :meth:`Codec.decode_mean_list_many`: on the device kernels, every tensor's index
        codes decoded and checked and its K payloads summed in one bucket op (one read-back of
        the validity flags for the bucket); bitwise :meth:`decode_mean_list` of each."""
        outs = list(outs) if outs is not None else [None] * len(payloads)
        if len(outs) != len(payloads):
            raise ValueError(f"dgc: {len(payloads)} tensors but {len(outs)} outs")
        firsts = [check_payload_list(self.name, ps)[0] for ps in payloads]
        if not firsts or not self.bucket_ops([f.device for f in firsts]):
            return super().decode_mean_list_many(payloads, scale, outs)
        ks = {len(ps) for ps in payloads}
        if len(ks) != 1:
            raise ValueError(f"dgc: a bucket's payloads come from one K ranks, got K = {sorted(ks)}")
        for ps in payloads:
            for p in ps:
                self._check_payload(p)
        scale = 1.0 / ks.pop() if scale is None else float(scale)
        flat_outs = [self.flat_out(o, f) for o, f in zip(outs, firsts)]
        flats = self._C.dgc_decode_sum_many([[p.buffers["indices"] for p in ps] for ps in payloads],
                                            [[p.buffers["values"] for p in ps] for ps in payloads],
                                            [f.numel for f in firsts], [f.dtype for f in firsts], scale, flat_outs)
        return [flat.view(f.shape) if o is None else o for flat, f, o in zip(flats, firsts, outs)]

    def accumulate_many_(self, us: Sequence[torch.Tensor], vs: Sequence[torch.Tensor], gs: Sequence[torch.Tensor],
                         momentum: float, nesterov: bool, coef: float = 1.0) -> None:
        """:meth:`accumulate_` of every ``(us[i], vs[i], gs[i])``, bitwise; on the device kernels
        the fp32/fp64 tensors in one bucket op (one device call per dtype), the others with
        :meth:`accumulate_`'s torch ops."""
        if not (len(us) == len(vs) == len(gs)):
            raise ValueError(f"dgc: accumulate_many_ got {len(us)} u, {len(vs)} v and {len(gs)} g")
        if not self.bucket_ops([g.device for g in gs]):
            for u, v, g in zip(us, vs, gs):
                self.accumulate_(u, v, g, momentum, nesterov, coef)
            return
        fused = [i for i, g in enumerate(gs) if g.dtype in NATIVE_ACCUMULATE_DTYPES]
        if fused:
            self._C.dgc_accumulate_many_([us[i] for i in fused], [vs[i] for i in fused],
                                         [gs[i].contiguous() for i in fused], momentum, nesterov, coef)
        for i, (u, v, g) in enumerate(zip(us, vs, gs)):
            if g.dtype not in NATIVE_ACCUMULATE_DTYPES:
                self.accumulate_(u, v, g, momentum, nesterov, coef)

    def mask_sent_many(self, sent: Sequence[torch.Tensor], vs: Sequence[torch.Tensor],
                       us: Optional[Sequence[torch.Tensor]] = None) -> None:
        """``v.view(-1).index_fill_(0, sent[i], 0)`` for every ``vs[i]`` (contiguous), and likewise
        ``us[i]`` when given: the sent entries leave the accumulation (and the momentum). On the
        device kernels one bucket op (one device call); ``sent[i]`` are the selection's indices
        (:meth:`encode_with_indices`)."""
        if len(sent) != len(vs) or (us is not None and len(us) != len(vs)):
            raise ValueError(f"dgc: mask_sent_many got {len(sent)} index tensors for {len(vs)} tensors"
                             + ("" if us is None else f" and {len(us)} momenta"))
        if self.bucket_ops([v.device for v in vs]):
            self._C.dgc_mask_many_(list(sent), list(vs), None if us is None else list(us))
            return
        for i, v in enumerate(vs):
            idx = sent[i].long()
            v.view(-1).index_fill_(0, idx, 0)
            if us is not None:
                us[i].view(-1).index_fill_(0, idx, 0)


def accumulate_in_kernels(impl: str, device_type: str, dtype: torch.dtype, has_cuda) -> bool:
    """Whether :meth:`DGCCodec.accumulate_` runs the extension's one-pass kernel (else torch ops):
    never for impl "reference" or dtypes outside :data:`NATIVE_ACCUMULATE_DTYPES`; always for
    "twin" (its op refuses tensors off the CPU: no silent fallback); for "native" on CPU tensors,
    and on CUDA tensors when ``has_cuda()`` (``_C.has_cuda``, called only then) is true."""
    if impl == "reference" or dtype not in NATIVE_ACCUMULATE_DTYPES:
        return False
    if impl == "twin" or device_type == "cpu":
        return True
    return device_type == "cuda" and bool(has_cuda())


def reference_select(flat: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """Exact top-k by magnitude (NaN largest), zeros dropped, indices ascending."""
    n = flat.numel()
    mag = flat.abs()
    if mag.dtype in (torch.float16, torch.bfloat16):
        mag = mag.float()  # exact; topk of reduced types is not available everywhere
    mag = torch.where(torch.isnan(mag), torch.full_like(mag, math.inf), mag)
    if n == 0 or k == 0:
        top = torch.zeros(0, dtype=torch.int64, device=flat.device)
    else:
        _, top = torch.topk(mag, k, sorted=False)
    top = top[mag[top] > 0]
    top, _ = torch.sort(top)
    t = float(mag[top].min()) if top.numel() else math.inf
    return top.to(index_dtype(n)), flat[top].clone(), t


def reference_index_encode(idx: torch.Tensor, n: int) -> torch.Tensor:
    """The index code of ascending ``idx`` (see "Wire format"), with torch ops."""
    if idx.numel() == 0:
        return torch.zeros(0, dtype=torch.uint8, device=idx.device)
    i64 = idx.long()
    gaps = torch.diff(i64, prepend=i64.new_full((1,), -1)) - 1
    top = int(gaps.max())
    if top < 256:
        return gaps.to(torch.uint8)
    if top < 65536:
        return torch.stack([gaps & 255, gaps >> 8], dim=1).to(torch.uint8).reshape(-1)
    return idx.to(index_dtype(n)).contiguous().view(torch.uint8).clone()


def reference_index_decode(code: torch.Tensor, count: int, n: int) -> torch.Tensor:
    """Inverse of :func:`reference_index_encode`: ``count`` indices (int32, or int64 when
    n >= 2^31), checked strictly increasing and in ``[0, n)``."""
    want = index_dtype(n)
    absolute = want.itemsize
    if count == 0:
        if code.numel():
            raise ValueError(f"dgc: {code.numel()} bytes of index code for 0 values")
        return torch.zeros(0, dtype=want, device=code.device)
    width, rest = divmod(code.numel(), count)
    if rest or width not in (1, 2, absolute):
        raise ValueError(f"dgc: {code.numel()} bytes of index code for {count} values (1, 2 or {absolute} bytes "
                         "per index expected)")
    if width == absolute:
        idx = code.clone().view(want).long()
    else:
        pairs = code.long().view(count, width)
        gaps = pairs[:, 0] if width == 1 else pairs[:, 0] | (pairs[:, 1] << 8)
        idx = torch.cumsum(gaps + 1, 0) - 1
    if bool((idx < 0).any()) or bool((idx >= n).any()) or bool((idx[1:] <= idx[:-1]).any()):
        raise ValueError(f"dgc: indices must be strictly increasing and in [0, {n})")
    return idx.to(want)
