"""TernGrad: stochastic ternarization with a scale shared by all ranks (Wen et al., 2017).

For a gradient ``g`` (any shape, flattened row-major, n values) and a scale ``s``:

* optional clipping (``clip=c``): ``a_i = min(|g_i|, t)`` with ``t = c * sigma``, sigma the
  (population) standard deviation of ``g``; no clipping when sigma is 0 (a constant tensor,
  e.g. any one-element tensor, has no outliers to clip). sigma is computed in float64 with one
  fixed summation order (:func:`fixed_order_sum`: mean, then the squared deviations), so it has
  the same bits on every device, thread count and implementation;
* ``local_scale(g) = max_i a_i``: what each rank contributes to the MAX-reduction; the caller
  agrees on ``s = max over ranks`` and passes it to :meth:`encode` (``scale=None`` uses the
  local one);
* ``g~_i = s * sign(g_i) * b_i``, ``b_i ~ Bernoulli(a_i / s)``: unbiased for the clipped
  gradient, ``E[g~] = sign(g) * a`` (element variance ``s*a_i - a_i^2``). A value with
  ``a_i >= s`` is always sent as ``s * sign(g_i)``.

Wire format (``Payload.buffers``, in this order):

* ``codes``: uint8[ceil(n/4)], element i in byte i//4 at bits 2*(i%4)..2*(i%4)+1 (LSB
  first); code 0 = 0, 1 = +1, 2 = -1 (3 is unused, read as 0); padding codes are 0;
* ``scale``: float32[1], ``s``.

So ``nbytes = ceil(n/4) + 4``. ``s`` is a float32 value (a scale passed in is rounded *up* to
float32, so that ``a_i / s <= 1`` still holds for every ``a_i <= scale``); ``s == 0`` (an
all-zero gradient) gives all-zero codes. Gradients may be fp16/bf16/fp32/fp64; the arithmetic
runs in float32 (float64 for fp64 gradients). No error feedback: ``encode`` refuses a residual.

Randomness: counter-based, not a ``torch.Generator``. Each codec object has a call counter
(advanced by every :meth:`encode`); call number c of a codec with options ``seed`` and
``rank_stream`` uses the 64-bit key ``splitmix64(splitmix64(splitmix64(seed) ^ rank_stream)
^ c)`` = (key1 << 32) | key0, and element i draws

    h = mix32(mix32((i + key0) mod 2^32) ^ key1),   u = (h >> 8) * 2^-24  in [0, 1)

(``mix32`` is the "lowbias32" integer hash with multipliers 0x21f0aaad, 0x735a2d97), and
``b_i = (u * s < a_i)``, computed in the arithmetic dtype. The native kernel (C++, any thread
split) and the pure-torch reference (int64 tensor ops) compute exactly this, so they produce
bit-identical codes for the same seed, rank_stream and call number; two codec objects with
the same seed and rank_stream produce identical streams; ranks passing their rank as
``rank_stream`` get independent streams. Tensors hold at most 2^32 values.

Decoding: ``decode_mean_stacked`` of K stacked payloads sums the K codes per element as integers and
multiplies once by ``s * scale`` (one pass, no K dense intermediates). If the K scales are not
all equal (the caller did not share ``s``), it falls back to the weighted sum
``scale * sum_k s_k * v_k`` (still exact in meaning, just no longer one integer sum).

Devices: the native kernels take CPU and (when ``_C`` has its CUDA kernels) CUDA tensors,
with identical codes and decoded values on both; ``impl="twin"`` runs the device kernels built
for the CPU (``_C_twin``) on CPU tensors. On the device kernels a bucket of tensors goes through
bucket ops (:meth:`TernGradCodec.local_scales_many`, ``encode_many``, ``decode_mean_stacked_many``):
a fixed number of device calls and at most one read back of the local scales for the whole
bucket, with the per-tensor results bit for bit.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from ..native import kernels_for, require_native_device
from .base import BufferSpec, Codec, Payload
from .dtypes import accumulation_dtype, check_float
from .payload_checks import check_fixed
from .registry import register_codec
from .streams import CounterStream, stream_keys32, uniform_bits
from .ternary_sum import MAX_K, TernarySumCodec

_MAX_VALUES = 1 << 32
_SUM_LANES, _SUM_BLOCK = 65536, 256  # csrc/device/terngrad_functors.h: kSumLanes, kSumBlock


def fixed_order_sum(v: torch.Tensor) -> torch.Tensor:
    """The sum of the float64 tensor ``v`` (flat) in the kernels' fixed order, as a 0-d tensor:
    L = min(n, 65536) lanes, lane p = ((0 + v[p]) + v[p + L]) + ... in index order; then the
    lanes in blocks of 256 (each 0 + its values in order), the block sums again, until one is
    left. Element-wise float64 adds only, so every device gives the same bits."""
    n, dev = v.numel(), v.device
    if n == 0:
        return torch.zeros((), dtype=torch.float64, device=dev)
    lanes = min(n, _SUM_LANES)
    acc = torch.zeros(lanes, dtype=torch.float64, device=dev)
    for r in range(0, n, lanes):
        chunk = v[r:r + lanes]
        acc[:chunk.numel()] += chunk
    while acc.numel() > 1:  # padding zeros change no sum: acc starts at +0 and never becomes -0
        m = acc.numel()
        nb = -(-m // _SUM_BLOCK)
        blocks = torch.zeros(nb * _SUM_BLOCK, dtype=torch.float64, device=dev)
        blocks[:m] = acc
        blocks = blocks.view(nb, _SUM_BLOCK)
        acc = torch.zeros(nb, dtype=torch.float64, device=dev)
        for c in range(_SUM_BLOCK):
            acc += blocks[:, c]
    return acc[0]


def clip_sigma(flat: torch.Tensor) -> float:
    """The population standard deviation of ``flat`` (n >= 1 values) as the kernels'
    ``terngrad_sigma`` computes it: float64, ``mean = sum / n``, ``sqrt(sum((g - mean)^2) / n)``,
    both sums by :func:`fixed_order_sum`."""
    n = flat.numel()
    x = flat.reshape(-1).to(torch.float64)
    mean = fixed_order_sum(x) / n
    d = x - mean
    return math.sqrt(fixed_order_sum(d * d).item() / n)


def _f32(x: float) -> float:
    """x rounded to the nearest float32."""
    return torch.tensor(x, dtype=torch.float64).to(torch.float32).item()


def _f32_up(x: float) -> float:
    """The smallest float32 >= x (NaN stays NaN)."""
    f = torch.tensor(x, dtype=torch.float64).to(torch.float32)
    if f.item() < x:
        f = torch.nextafter(f, torch.tensor(math.inf, dtype=torch.float32))
    return f.item()


def _pack2(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes[n] in 0..3 -> uint8[ceil(n/4)], 4 per byte, LSB first."""
    n = codes.numel()
    padded = torch.zeros((n + 3) // 4 * 4, dtype=torch.uint8, device=codes.device)
    padded[:n] = codes
    weights = torch.tensor([1, 4, 16, 64], dtype=torch.uint8, device=codes.device)
    return (padded.view(-1, 4) * weights).sum(1, dtype=torch.uint8)


def _unpack2(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8[..., >= ceil(n/4)] -> values int8[..., n] in {-1, 0, +1} (code 3 reads as 0)."""
    lead = packed.shape[:-1]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=packed.device)
    nb = (n + 3) // 4
    c = ((packed[..., :nb].unsqueeze(-1) >> shifts) & 3).reshape(*lead, 4 * nb)[..., :n]
    return ((c & 1).to(torch.int8) - (c >> 1).to(torch.int8))


@register_codec("terngrad")
class TernGradCodec(CounterStream, Codec):
    """TernGrad: 2-bit stochastic ternary codes and one float32 scale shared by all ranks."""

    #: the adapter agrees on one scale per tensor (MAX of ``local_scale``) before ``encode``
    shared_scale = True
    fuses_feedback = False
    error_feedback_default = False
    #: Under the Adam family: clipping at 1.0 sigma (the ternary values' second moment s*|g|,
    #: s the largest |g|, inflates Adam's denominator; clipping lowers s: docs/results/adam_table.md).
    adam_defaults = {"clip": 1.0}
    #: Under torch.optim.SGD: the paper's clipping at 2.5 sigma. Unclipped, the scale is the
    #: largest |g| of the tensor and the ternary noise ``s*|g_i| - g_i^2`` that SGD's momentum
    #: integrates grows with it; the FSDP2 transformer at K = 4 ended 5-8% above dense in three of
    #: five runs without the clip and 2-3% above in all three seeds with it (docs/results/fsdp_accuracy.md).
    sgd_defaults = {"clip": 2.5}
    default_pattern = "auto"   # two-phase owners send exact sums: TernGrad's math, fewer bytes from K = 4

    def __init__(self, impl: str = "native", seed: int = 0, rank_stream: int = 0,
                 clip: Optional[float] = None, warmup_steps: int = 0):
        """``warmup_steps``: the exchange averages the first N steps at full precision
        (:mod:`horovod_gradcomp.exchange.dense`), this codec's payloads from step N on."""
        super().__init__(impl)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"terngrad: warmup_steps must be an int >= 0, got {warmup_steps!r}")
        self.warmup_steps = warmup_steps
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"terngrad: seed must be an int, got {seed!r}")
        if isinstance(rank_stream, bool) or not isinstance(rank_stream, int):
            raise TypeError(f"terngrad: rank_stream must be an int, got {rank_stream!r}")
        if clip is not None:
            clip = float(clip)
            if not (clip > 0 and math.isfinite(clip)):
                raise ValueError(f"terngrad: clip must be a positive finite number or None, got {clip!r}")
        self.seed, self.rank_stream, self.clip = seed, rank_stream, clip
        self.counter = 0  # encode calls so far: the position in this codec's random stream
        if impl != "reference":
            self._C = kernels_for(impl, "terngrad")

    def __repr__(self) -> str:
        # rank_stream is left out on purpose: it differs between ranks by design, and the
        # adapter's agreement check compares repr(codec) across ranks.
        extra = f", warmup_steps={self.warmup_steps}" if self.warmup_steps else ""
        return f"{type(self).__name__}(impl={self.impl!r}, seed={self.seed}, clip={self.clip}{extra})"

    # -- helpers ------------------------------------------------------------------
    def _check(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"terngrad: expected a tensor, got {type(tensor).__name__}")
        check_float("terngrad", tensor)
        if tensor.numel() > _MAX_VALUES:
            raise ValueError(f"terngrad: at most 2^32 values per tensor, got {tensor.numel()}")
        if self.impl == "native":
            require_native_device(tensor.device, "terngrad")

    def _clip_threshold(self, flat: torch.Tensor) -> Optional[float]:
        """t = clip * sigma (float32-rounded unless fp64), None without clipping or when sigma is 0."""
        if self.clip is None or flat.numel() == 0:
            return None
        sigma = float(self._C.terngrad_sigma(flat.contiguous())) if self.uses_kernels else clip_sigma(flat)
        return self._threshold_of(sigma, flat.dtype)

    def _threshold_of(self, sigma: float, dtype: torch.dtype) -> Optional[float]:
        """The clip threshold of a ``dtype`` tensor whose sigma is ``sigma`` (clipping on):
        ``clip * sigma``, float32-rounded unless fp64; None when sigma is not > 0."""
        if not sigma > 0:  # constant tensor (or NaN): nothing to clip
            return None
        t = self.clip * sigma
        return t if accumulation_dtype(dtype) == torch.float64 else _f32(t)

    @staticmethod
    def _scale_of(max_abs: float, t: Optional[float]) -> float:
        """The local scale of a tensor with max |g| ``max_abs`` and clip threshold ``t``: the
        smallest float32 >= min(max_abs, t) (NaN stays NaN)."""
        if t is not None and not math.isnan(max_abs):
            max_abs = min(max_abs, t)
        return _f32_up(max_abs)

    def _max_abs(self, flat: torch.Tensor) -> float:
        if flat.numel() == 0:
            return 0.0
        if self.uses_kernels:
            return float(self._C.terngrad_max_abs(flat.contiguous()))
        return flat.to(accumulation_dtype(flat.dtype)).abs().max().item()

    def _local_scale(self, flat: torch.Tensor, t: Optional[float]) -> float:
        return self._scale_of(self._max_abs(flat), t)

    def layout(self, shape: Sequence[int], dtype: torch.dtype) -> List[BufferSpec]:
        n = math.prod(shape)
        return [("codes", torch.uint8, (n + 3) // 4), ("scale", torch.float32, 1)]

    def owner_sum_codec(self, k: int):
        """The two-phase owner sends the exact sum of the K ternary payloads (the shared scale
        times an integer in [-K, K]; :mod:`horovod_gradcomp.codecs.ternary_sum`) instead of
        ternarizing their mean again; beyond ``MAX_K`` ranks (sums wider than 16 bits) it
        ternarizes again (None)."""
        return TernarySumCodec(k, self.impl) if k <= MAX_K else None

    # -- scale ----------------------------------------------------------------------
    def local_scale(self, tensor: torch.Tensor) -> float:
        """max |g| after the optional clipping, as a float32 value: this rank's contribution
        to the MAX-reduction that gives the shared scale."""
        self._check(tensor)
        flat = tensor.reshape(-1)
        return self._local_scale(flat, self._clip_threshold(flat))

    # -- encode -------------------------------------------------------------------
    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None,
               scale: Optional[float] = None) -> Payload:
        """Encode ``tensor`` with the shared scale ``scale`` (``local_scale(tensor)`` when None).
        Advances this codec's random stream by one call."""
        self._check(tensor)
        if residual is not None:
            raise ValueError("terngrad: runs without error feedback; encode takes no residual")
        flat = tensor.reshape(-1)
        t = self._clip_threshold(flat)
        if scale is None:
            s = self._local_scale(flat, t)
        else:
            s = float(scale)
            if s < 0:
                raise ValueError(f"terngrad: the scale must be >= 0, got {s}")
            s = _f32_up(s)
        key0, key1 = stream_keys32(self.seed, self.rank_stream, self.next_position())
        if self.uses_kernels:
            codes, scale_buf = self._C.terngrad_encode(flat.contiguous(), s, math.inf if t is None else t,
                                                       key0, key1)
        else:
            codes, scale_buf = self._reference_encode(flat, s, t, key0, key1)
        return Payload({"codes": codes, "scale": scale_buf}, tensor.shape, tensor.dtype, tensor.device)

    @staticmethod
    def _reference_encode(flat: torch.Tensor, s: float, t: Optional[float], key0: int, key1: int):
        n, dev = flat.numel(), flat.device
        scale_buf = torch.full((1,), s, dtype=torch.float32, device=dev)
        if n == 0 or s == 0:
            return torch.zeros((n + 3) // 4, dtype=torch.uint8, device=dev), scale_buf
        acc = accumulation_dtype(flat.dtype)
        g = flat.to(acc)
        a = g.abs()
        if t is not None:
            a = a.clamp(max=t)
        u = uniform_bits(n, key0, key1, dev).to(acc).mul_(2.0 ** -24)
        sel = u.mul_(s) < a
        codes = torch.where(sel, torch.where(g < 0, 2, 1), 0).to(torch.uint8)
        return _pack2(codes), scale_buf

    # -- a bucket at once -----------------------------------------------------------
    def bucket_ops(self, devices: Sequence[torch.device]) -> bool:
        """The device kernels' bucket ops (``terngrad_scale_stats_many``, ``terngrad_encode_many``,
        ``terngrad_decode_sum_many``: at most 10, 1 and 2 device calls per dtype)."""
        return self.on_device_kernels(devices)

    def _flats(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """The checked, flat, contiguous views of a bucket's tensors, as the kernels take them."""
        for t in tensors:
            self._check(t)
        return [t.reshape(-1).contiguous() for t in tensors]

    def _bucket_stats(self, flats: Sequence[torch.Tensor]) -> List[Tuple[float, Optional[float]]]:
        """``(max |g|, clip threshold or None)`` of each of a bucket's flat tensors: what
        ``_max_abs`` and ``_clip_threshold`` give, from one ``terngrad_scale_stats_many`` (one read
        back of one small tensor for the whole bucket)."""
        with_sigma = self.clip is not None
        max_abs, sigma = self._C.terngrad_scale_stats_many(list(flats), with_sigma).tolist()
        return [(m, self._threshold_of(sg, f.dtype) if with_sigma and f.numel() else None)
                for m, sg, f in zip(max_abs, sigma, flats)]

    def local_scales_many(self, tensors: Sequence[torch.Tensor]) -> List[float]:
        """``[local_scale(t) for t in tensors]``, the same values; one bucket op (one read back)
        where :meth:`bucket_ops` accepts the tensors."""
        tensors = list(tensors)
        if not self.bucket_ops([t.device for t in tensors]):
            return [self.local_scale(t) for t in tensors]
        return [self._scale_of(m, t) for m, t in self._bucket_stats(self._flats(tensors))]

    def encode_many(self, tensors, residuals=None, options=None, positions=None) -> List[Payload]:
        """See :meth:`Codec.encode_many`: tensor i with ``options[i]`` (its ``scale``; None or
        absent: the local one) from stream position ``positions[i]``, which advances the stream
        as ``encode`` would. One read back for the bucket when a scale is missing or clipping is
        on (the scale stats), none otherwise."""
        tensors = list(tensors)
        if not self.bucket_ops([t.device for t in tensors]):
            return super().encode_many(tensors, residuals, options, positions)
        if residuals is not None and any(r is not None for r in residuals):
            raise ValueError("terngrad: runs without error feedback; encode takes no residual")
        given = self._given_scales(options, len(tensors))
        flats = self._flats(tensors)
        stats = self._bucket_stats(flats) if self.clip is not None or None in given else None
        clips = [stats[i][1] if stats is not None else None for i in range(len(flats))]
        scales = [self._scale_of(stats[i][0], clips[i]) if s is None else s for i, s in enumerate(given)]
        keys = []
        for i in range(len(flats)):
            if positions is not None:
                self.reset_stream(positions[i])
            keys.append(stream_keys32(self.seed, self.rank_stream, self.next_position()))
        codes, scale_bufs = self._C.terngrad_encode_many(flats, scales, [math.inf if t is None else t for t in clips],
                                                         [k[0] for k in keys], [k[1] for k in keys])
        return [Payload({"codes": c, "scale": b}, t.shape, t.dtype, t.device)
                for c, b, t in zip(codes, scale_bufs, tensors)]

    @staticmethod
    def _given_scales(options: Optional[Sequence[dict]], count: int) -> List[Optional[float]]:
        """Each tensor's scale from its encode options, rounded up to float32 as ``encode`` does
        (None: not given). Checked: one dict per tensor, no option but ``scale``, scales >= 0."""
        if options is None:
            return [None] * count
        if len(options) != count:
            raise ValueError(f"terngrad: {count} tensors but {len(options)} encode options")
        scales = []
        for o in options:
            unknown = sorted(set(o) - {"scale"})
            if unknown:
                raise TypeError(f"terngrad: encode got unexpected options {unknown}")
            s = o.get("scale")
            if s is not None:
                s = float(s)
                if s < 0:
                    raise ValueError(f"terngrad: the scale must be >= 0, got {s}")
                s = _f32_up(s)
            scales.append(s)
        return scales

    def decode_mean_stacked_many(self, stacked, scale=None, outs=None) -> List[torch.Tensor]:
        """See :meth:`Codec.decode_mean_stacked_many`."""
        stacked = list(stacked)
        outs = list(outs) if outs is not None else [None] * len(stacked)
        if len(outs) != len(stacked):
            raise ValueError(f"terngrad: {len(stacked)} stacked payloads but {len(outs)} outs")
        if not self.bucket_ops([p.device for p in stacked]):
            return super().decode_mean_stacked_many(stacked, scale, outs)
        ks = {check_fixed(self, p, stacked=True) for p in stacked}
        if len(ks) != 1:
            raise ValueError(f"terngrad: a bucket's payloads come from one K ranks, got K = {sorted(ks)}")
        scale = 1.0 / ks.pop() if scale is None else float(scale)
        flat_outs = [self.flat_out(o, p) for o, p in zip(outs, stacked)]
        flats = self._C.terngrad_decode_sum_many(
            [p.buffers["codes"] for p in stacked], [p.buffers["scale"] for p in stacked], [p.numel for p in stacked],
            [p.dtype for p in stacked], scale, flat_outs)
        return [f.view(p.shape) if o is None else o for f, p, o in zip(flats, stacked, outs)]

    # -- decode -------------------------------------------------------------------
    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The tensor ``s * v`` (v in {-1, 0, +1}) of the payload's shape and dtype, written
        into ``out`` when given (contiguous, same shape and dtype)."""
        check_fixed(self, payload)
        stacked = Payload({k: b.unsqueeze(0) for k, b in payload.buffers.items()}, payload.shape, payload.dtype,
                          payload.device)
        return self.decode_mean_stacked(stacked, 1.0, out)

    def decode_mean_stacked(self, stacked: Payload, scale: float | None = None,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``scale * sum_k decode(payload_k)`` (``scale`` defaults to 1/K) in one pass over the
        K payloads: ``(sum_k v_k) * s * scale`` when all K scales are equal (the shared-scale
        case), else ``scale * sum_k s_k * v_k``. Written into ``out`` when given."""
        k, n = check_fixed(self, stacked, stacked=True), stacked.numel
        codes, scales = stacked.buffers["codes"], stacked.buffers["scale"]
        scale = 1.0 / k if scale is None else float(scale)
        flat_out = self.flat_out(out, stacked)
        if self.uses_kernels:
            if self.impl == "native":
                require_native_device(codes.device, "terngrad")
            flat = self._C.terngrad_decode_sum(codes, scales, n, stacked.dtype, scale, flat_out)
            return flat.view(stacked.shape)
        flat = self._reference_decode_sum(codes, scales, n, stacked.dtype, scale)
        if flat_out is not None:
            flat_out.copy_(flat)
            return out
        return flat.view(stacked.shape)

    @staticmethod
    def _reference_decode_sum(codes: torch.Tensor, scales: torch.Tensor, n: int, dtype: torch.dtype,
                              scale: float) -> torch.Tensor:
        acc = accumulation_dtype(dtype)
        k = codes.shape[0]
        s = scales[:, 0]
        values = _unpack2(codes, n)  # int8 [K, n]
        if k <= MAX_K and bool((s == s[0]).all()):  # the integer sums fit biased 16-bit lanes
            total = values.sum(0, dtype=torch.int32).to(acc)
            return total.mul_(s[0].item() * scale).to(dtype)
        total = torch.zeros(n, dtype=acc, device=codes.device)
        for i in range(k):
            total.add_(values[i].to(acc) * s[i].item())
        return total.mul_(scale).to(dtype)
