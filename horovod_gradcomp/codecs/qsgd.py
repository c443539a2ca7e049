"""QSGD: stochastic quantization to s levels per bucket (Alistarh et al., NIPS 2017).

The flat tensor is cut into buckets of ``d`` values (``bucket``, the last one shorter). For
a bucket ``v`` with norm ``||v||`` (``norm="l2"``: 2-norm, ``norm="max"``: max |v_i|) and
``r_i = |v_i| * (s / ||v||)`` clamped to ``[0, s]`` (NaN -> 0), ``l_i = min(floor(r_i), s-1)``:

* level ``q_i = l_i + 1`` with probability ``r_i - l_i``, else ``l_i`` (so E[q_i] = r_i);
* decoded value ``Q_i = sgn(v_i) * q_i * (||v|| / s)``: unbiased, and for the 2-norm
  ``E||Q(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2`` per bucket. A zero bucket decodes to 0.

Arithmetic: float32 (float64 for fp64 tensors); the norm is sent as float32 and both the
quantizer and the decoder use that float32 value. The 2-norm is computed in a fixed order
(squares in float64, lane ``k % 8`` of the bucket summed in order, lanes combined as
``((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))``, sqrt, rounded to float32) so that the native
kernels and the pure-torch reference agree bit for bit.

Randomness (counter-based, no generator state to ship): call ``c`` of a codec with options
``seed`` and ``rank_stream`` uses the 64-bit key ``K = mix(mix(mix(seed + G) ^ rank_stream) + c + G)``
(``mix`` = the splitmix64 finalizer, ``G = 0x9E3779B97F4A7C15``, arithmetic mod 2^64).
Value ``i`` of the flat tensor draws ``u_i = bits(h) * 2^-24`` with
``h = mix(K + (i // 2 + 1) * G)``, ``bits`` = bits 8..31 of ``h`` for even ``i`` and bits
40..63 for odd ``i``; it rounds up when ``u_i < r_i - l_i``. The counter advances by one
per :meth:`QSGDCodec.encode` call, so equal ``(seed, rank_stream)`` and the same sequence
of calls give the same integers, whatever the impl; ranks pass their rank as
``rank_stream`` to draw independent streams. (Native and reference agree on CPU; the
reference on CUDA uses the same integer stream but its own float summation order.)

Wire formats (``Payload.buffers``, in this order); ``w = 1 + bit_length(s)`` bits per value:

* ``coding="fixed"`` (``variable_size = False``):
  ``norms`` float32[num_buckets], then ``packed`` uint8[ceil(n*w/8)]: value i's code
  ``sign | q << 1`` (sign = 1 for a negative value with q > 0) occupies bits
  ``[i*w, (i+1)*w)`` of an LSB-first bit stream (bit j = byte j//8, bit j%8); pad bits 0.
  ``nbytes = 4*num_buckets + ceil(n*w/8)``.
* ``coding="elias"`` (``variable_size = True``, lossless, same integers as ``fixed``):
  ``norms`` float32[num_buckets], ``nbits`` int64[num_groups], ``stream`` uint8.
  A group is ``ceil(65536/d)`` consecutive buckets (one group when ``n <= 65536``);
  group g's code is ``nbits[g]`` bits starting on a byte boundary, so the stream holds
  ``sum_g ceil(nbits[g]/8)`` bytes (groups let the native decoder run in parallel; the
  header is 8 bytes per 65536 values). A bucket's code, LSB-first:
  ``gamma(nnz + 1)``, then for each nonzero q_i in order ``gamma(gap + 1)`` (gap = number
  of zeros since the previous nonzero or the bucket start), the sign bit (1 = negative),
  ``gamma(|q_i|)``. ``gamma(x)``, x >= 1, N = floor(log2 x): N zero bits, a one bit, then
  the N low bits of x least significant first (Elias gamma, 2N+1 bits).
  ``nbytes = 4*num_buckets + 8*num_groups + sum_g ceil(nbits[g]/8)``; ``layout`` raises.

QSGD is used without error feedback here (``fuses_feedback = False``; ``encode`` refuses a
residual). The native kernels run on CPU and (when ``_C`` has its CUDA kernels) CUDA tensors,
with identical norms, codes and decoded values; ``impl="twin"`` runs the device kernels built
for the CPU (``_C_twin``) on CPU tensors; ``impl="reference"`` runs on any device. On the device
kernels, a bucket of tensors is encoded and decoded by the bucket ops (:meth:`QSGDCodec.encode_many`,
``decode_mean_stacked_many``, ``decode_mean_list_many``): a fixed number of device calls per dtype
whatever the tensor count, bitwise the per-tensor results.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from ..native import kernels_for, require_native_device
from .base import BufferSpec, Codec, Payload
from .bitpack import pack_bits, unpack_bits
from .dtypes import accumulation_dtype, check_float
from .payload_checks import check_buffers, check_fixed, check_payload_list
from .registry import register_codec
from .streams import CounterStream, stream_key, uniforms

MAX_LEVELS = (1 << 24) - 1
MAX_BUCKET = (1 << 31) - 1
GROUP_VALUES = 1 << 16



def code_width(s: int) -> int:
    """Bits per value of the fixed coding: sign + bit_length(s)."""
    return 1 + s.bit_length()


def num_buckets(n: int, d: int) -> int:
    return (n + d - 1) // d


def group_buckets(d: int) -> int:
    """Buckets per Elias group (groups hold >= 65536 values)."""
    return max(1, -(-GROUP_VALUES // d))


def num_groups(n: int, d: int) -> int:
    return max(1, -(-num_buckets(n, d) // group_buckets(d)))


# -- pure-torch reference -----------------------------------------------------------------

def _bucket_grid(flat: torch.Tensor, d: int, width: int) -> torch.Tensor:
    """[B, width] (width >= d) with the buckets in rows, zero-padded."""
    n = flat.numel()
    b = num_buckets(n, d)
    grid = torch.zeros(b, width, dtype=flat.dtype, device=flat.device)
    if n:
        padded = torch.zeros(b * d, dtype=flat.dtype, device=flat.device)
        padded[:n] = flat
        grid[:, :d] = padded.view(b, d)
    return grid


def reference_norms(flat: torch.Tensor, d: int, max_norm: bool) -> torch.Tensor:
    """float32[B] bucket norms, in the documented summation order."""
    acc = accumulation_dtype(flat.dtype)
    v = flat.to(acc)
    n = v.numel()
    b = num_buckets(n, d)
    if b == 0:
        return torch.zeros(0, dtype=torch.float32, device=flat.device)
    if max_norm:
        return _bucket_grid(v.abs(), d, d).amax(1).to(torch.float32)
    width = -(-d // 8) * 8
    sq = v.to(torch.float64)
    sq = sq * sq
    lanes = _bucket_grid(sq, d, width).view(b, width // 8, 8)
    lanes = lanes.cumsum(1)[:, -1, :]  # sequential per lane (CPU)
    l = [lanes[:, j] for j in range(8)]
    total = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
    return total.sqrt().to(torch.float32)


def reference_levels(flat: torch.Tensor, norms: torch.Tensor, s: int, d: int, key: int) -> torch.Tensor:
    """int64[n] signed levels in [-s, s]."""
    acc = accumulation_dtype(flat.dtype)
    n = flat.numel()
    v = flat.to(acc)
    bucket_of = torch.arange(n, device=flat.device) // d
    inv = (torch.tensor(float(s), dtype=acc, device=flat.device) / norms.to(acc))[bucket_of]
    r = v.abs() * inv
    r = torch.where(r >= 0, r, torch.zeros((), dtype=acc, device=flat.device))
    r = torch.clamp(r, max=float(s))
    fl = torch.clamp(torch.trunc(r), max=float(s - 1))
    p = r - fl
    u = uniforms(key, n, flat.device).to(acc)
    lvl = fl.to(torch.int64) + (u < p).to(torch.int64)
    return torch.where(v < 0, -lvl, lvl)


def reference_values(q: torch.Tensor, norms: torch.Tensor, s: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """Decoded flat tensor of ``dtype`` from signed levels and float32 norms."""
    acc = accumulation_dtype(dtype)
    n = q.numel()
    scale = (norms.to(acc) / torch.tensor(float(s), dtype=acc, device=norms.device))
    scale = scale[torch.arange(n, device=q.device) // d]
    mag = q.abs().to(acc) * scale
    return torch.where(q < 0, -mag, mag).to(dtype)


def _bits_lsb(values: torch.Tensor, width: int) -> torch.Tensor:
    """bool[numel, width]: the ``width`` low bits of each int64 value, least significant first."""
    shifts = torch.arange(width, device=values.device, dtype=torch.int64)
    return ((values.reshape(-1, 1) >> shifts) & 1).bool()


def reference_pack_fixed(q: torch.Tensor, s: int) -> torch.Tensor:
    w = code_width(s)
    codes = (q < 0).to(torch.int64) | (q.abs() << 1)
    return pack_bits(_bits_lsb(codes, w).reshape(-1))


def reference_unpack_fixed(packed: torch.Tensor, n: int, s: int) -> torch.Tensor:
    w = code_width(s)
    bits = unpack_bits(packed, n * w).view(n, w).to(torch.int64)
    codes = (bits << torch.arange(w, device=packed.device, dtype=torch.int64)).sum(1)
    mag = codes >> 1
    return torch.where((codes & 1) == 1, -mag, mag)


def _gamma_codes(x: torch.Tensor):
    """(code value, code length) of Elias gamma (as documented) for int64 x >= 1."""
    nz = torch.floor(torch.log2(x.to(torch.float64))).to(torch.int64)
    nz = nz - ((1 << nz) > x).to(torch.int64)
    nz = nz + ((1 << (nz + 1)) <= x).to(torch.int64)
    top = 1 << nz
    return top | ((x ^ top) << (nz + 1)), 2 * nz + 1


def reference_elias_encode(q: torch.Tensor, d: int):
    """(nbits int64[G], stream uint8) of the signed levels, vectorized torch."""
    dev = q.device
    n = q.numel()
    b = num_buckets(n, d)
    gb = group_buckets(d)
    g_count = num_groups(n, d)
    idx = torch.nonzero(q).view(-1)
    m = idx.numel()
    bucket = idx // d
    nnz = torch.bincount(bucket, minlength=b) if b else torch.zeros(0, dtype=torch.int64, device=dev)
    # gaps: distance to the previous nonzero of the same bucket (or to the bucket start - 1)
    prev = torch.full((m,), -1, dtype=torch.int64, device=dev)
    if m:
        prev[1:] = idx[:-1]
        same = torch.zeros(m, dtype=torch.bool, device=dev)
        same[1:] = bucket[1:] == bucket[:-1]
        prev = torch.where(same, prev, bucket * d - 1)
    gap1 = idx - prev
    mag = q[idx].abs()
    neg = (q[idx] < 0).to(torch.int64)
    hv, hl = _gamma_codes(nnz + 1)
    gv, gl = _gamma_codes(gap1)
    lv, ll = _gamma_codes(mag)
    # code order: bucket header, then (gap, sign, level) per nonzero
    total = b + 3 * m
    vals = torch.zeros(total, dtype=torch.int64, device=dev)
    lens = torch.zeros(total, dtype=torch.int64, device=dev)
    code_group = torch.zeros(total, dtype=torch.int64, device=dev)
    before = torch.cumsum(nnz, 0) - nnz  # nonzeros in earlier buckets
    hpos = torch.arange(b, device=dev) + 3 * before
    vals[hpos], lens[hpos], code_group[hpos] = hv, hl, torch.arange(b, device=dev) // gb
    j = torch.arange(m, device=dev)
    base = bucket + 1 + 3 * j
    for t, (cv, cl) in enumerate(((gv, gl), (neg, torch.ones_like(neg)), (lv, ll))):
        vals[base + t], lens[base + t], code_group[base + t] = cv, cl, bucket // gb
    gbits = torch.zeros(g_count, dtype=torch.int64, device=dev).index_add_(0, code_group, lens)
    gbytes = (gbits + 7) // 8
    gstart_bits = (torch.cumsum(gbytes, 0) - gbytes) * 8
    within = torch.cumsum(lens, 0) - lens
    gfirst = torch.cumsum(torch.bincount(code_group, minlength=g_count), 0) - torch.bincount(code_group,
                                                                                          minlength=g_count)
    if total:
        within = within - within[gfirst.clamp(max=total - 1)][code_group]
    pos = gstart_bits[code_group] + within
    nbytes = int(gbytes.sum())
    bits = torch.zeros(nbytes * 8, dtype=torch.bool, device=dev)
    if total:
        owner = torch.repeat_interleave(torch.arange(total, device=dev), lens)
        t = torch.arange(owner.numel(), device=dev) - (torch.cumsum(lens, 0) - lens)[owner]
        bits[pos[owner] + t] = ((vals[owner] >> t) & 1).bool()
    return gbits, pack_bits(bits)


def reference_elias_decode(nbits: torch.Tensor, stream: torch.Tensor, n: int, s: int, d: int) -> torch.Tensor:
    """int64[n] signed levels from an Elias stream: a sequential Python parser (slow oracle)."""
    b = num_buckets(n, d)
    gb = group_buckets(d)
    nb = [int(x) for x in nbits.tolist()]
    if len(nb) != num_groups(n, d):
        raise ValueError(f"qsgd: expected {num_groups(n, d)} group bit counts, got {len(nb)}")
    starts = [0]
    for x in nb:
        if x < 0:
            raise ValueError("qsgd: negative bit count in an Elias header")
        starts.append(starts[-1] + (x + 7) // 8)
    if stream.numel() != starts[-1]:
        raise ValueError(f"qsgd: the Elias stream holds {stream.numel()} bytes, the header says {starts[-1]}")
    out = [0] * n
    raw = stream.cpu()
    for g, limit in enumerate(nb):
        bits = unpack_bits(raw[starts[g]:starts[g + 1]], limit).tolist() if limit else []
        pos = 0

        def read_gamma():
            nonlocal pos
            z = 0
            while pos < limit and not bits[pos]:
                z += 1
                pos += 1
            if pos >= limit or pos + 1 + z > limit:
                raise ValueError("qsgd: malformed Elias stream")
            pos += 1
            x = 1 << z
            for k in range(z):
                x |= bits[pos + k] << k
            pos += z
            return x

        for bk in range(g * gb, min(b, (g + 1) * gb)):
            i0 = bk * d
            length = min(d, n - i0)
            cnt = read_gamma() - 1
            if cnt > length:
                raise ValueError("qsgd: malformed Elias stream")
            at = -1
            for _ in range(cnt):
                at += read_gamma()
                if pos >= limit:
                    raise ValueError("qsgd: malformed Elias stream")
                neg = bits[pos]
                pos += 1
                lvl = read_gamma()
                if at >= length or lvl > s:
                    raise ValueError("qsgd: malformed Elias stream")
                out[i0 + at] = -lvl if neg else lvl
        if pos != limit:
            raise ValueError("qsgd: malformed Elias stream")
    return torch.tensor(out, dtype=torch.int64, device=stream.device)


# -- the codec ----------------------------------------------------------------------------

@register_codec("qsgd")
class QSGDCodec(CounterStream, Codec):
    """QSGD stochastic quantizer (s levels per bucket), fixed-width or Elias coding."""

    fuses_feedback = False
    error_feedback_default = False
    default_pattern = "auto"
    #: "max" in the factories (``Compression.qsgd``, ``Compression.codec("qsgd")``, the DDP hook):
    #: with 4 bits the 2-norm's variance diverges the demo's model (docs/guide/codecs/qsgd.md).
    adapter_defaults = {"norm": "max"}
    variable_size = False
    #: A NaN or Inf makes its bucket's norm NaN or Inf (the kernels send it as is and map the
    #: values to level 0): the exchange finds non-finite input in the norms it receives.
    shows_nonfinite = True

    def payload_nonfinite(self, payload: Payload) -> bool:
        """True when a norm of ``payload`` (single or stacked) is NaN or Inf: its input held a
        NaN or Inf (or a bucket norm past float32's range)."""
        norms = payload.buffers["norms"]
        return norms.numel() > 0 and not bool(torch.isfinite(norms).all())

    def __init__(self, impl: str = "native", levels: Optional[int] = None, bits: Optional[int] = None,
                 bucket: int = 512, norm: str = "l2", coding: str = "fixed", seed: int = 0, rank_stream: int = 0):
        super().__init__(impl)
        if levels is not None and bits is not None:
            raise ValueError(f"qsgd: give levels or bits, not both (got levels={levels!r}, bits={bits!r})")
        for name, val in (("levels", levels), ("bits", bits), ("bucket", bucket), ("seed", seed),
                          ("rank_stream", rank_stream)):
            if val is not None and (isinstance(val, bool) or not isinstance(val, int)):
                raise ValueError(f"qsgd: {name} must be an int, got {val!r}")
        if levels is None:
            bits = 4 if bits is None else bits
            if not 2 <= bits <= 25:
                raise ValueError(f"qsgd: bits must be in [2, 25] (sign + level bits; s = 2^(bits-1) - 1), "
                                 f"got {bits}")
            levels = (1 << (bits - 1)) - 1
        if not 1 <= levels <= MAX_LEVELS:
            raise ValueError(f"qsgd: levels must be in [1, {MAX_LEVELS}], got {levels}")
        if not 1 <= bucket <= MAX_BUCKET:
            raise ValueError(f"qsgd: bucket must be in [1, {MAX_BUCKET}], got {bucket}")
        if norm not in ("l2", "max"):
            raise ValueError(f"qsgd: norm must be 'l2' or 'max', got {norm!r}")
        if coding not in ("fixed", "elias"):
            raise ValueError(f"qsgd: coding must be 'fixed' or 'elias', got {coding!r}")
        self.s = levels
        self.bucket = bucket
        self.norm = norm
        self.coding = coding
        self.seed = seed
        self.rank_stream = rank_stream
        self.variable_size = coding == "elias"
        self.counter = 0
        if impl != "reference":
            self._C = kernels_for(impl, "qsgd")

    @property
    def width(self) -> int:
        """Bits per value of the fixed coding."""
        return code_width(self.s)

    def __repr__(self) -> str:
        return (f"QSGDCodec(impl={self.impl!r}, levels={self.s}, bucket={self.bucket}, norm={self.norm!r}, "
                f"coding={self.coding!r}, seed={self.seed}, rank_stream={self.rank_stream})")

    def layout(self, shape: Sequence[int], dtype: torch.dtype) -> List[BufferSpec]:
        if self.coding == "elias":
            raise NotImplementedError(
                "qsgd: coding='elias' has variable-size payloads (variable_size=True): there is no fixed layout; "
                "exchange the payload buffers with their sizes, or use coding='fixed'")
        n = math.prod(shape)
        return [("norms", torch.float32, num_buckets(n, self.bucket)),
                ("packed", torch.uint8, (n * self.width + 7) // 8)]

    # -- encode -------------------------------------------------------------------
    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Payload:
        if residual is not None:
            raise ValueError("qsgd: QSGD is used without error feedback here (fuses_feedback=False); "
                             "pass residual=None")
        check_float("qsgd", tensor)
        key = stream_key(self.seed, self.rank_stream, self.next_position())
        flat = tensor.reshape(-1)
        max_norm = self.norm == "max"
        if self.uses_kernels:
            if self.impl == "native":
                require_native_device(tensor.device, "qsgd")
            x = flat.contiguous()
            if self.coding == "fixed":
                norms, packed = self._C.qsgd_encode_fixed(x, self.s, self.bucket, max_norm, key)
                bufs = {"norms": norms, "packed": packed}
            else:
                norms, nbits, stream = self._C.qsgd_encode_elias(x, self.s, self.bucket, max_norm, key,
                                                                 group_buckets(self.bucket))
                bufs = {"norms": norms, "nbits": nbits, "stream": stream}
        else:
            norms = reference_norms(flat, self.bucket, max_norm)
            q = reference_levels(flat, norms, self.s, self.bucket, key)
            if self.coding == "fixed":
                bufs = {"norms": norms, "packed": reference_pack_fixed(q, self.s)}
            else:
                nbits, stream = reference_elias_encode(q, self.bucket)
                bufs = {"norms": norms, "nbits": nbits, "stream": stream}
        return Payload(bufs, tensor.shape, tensor.dtype, tensor.device)

    def levels_of(self, payload: Payload) -> torch.Tensor:
        """int64[n] signed levels a payload carries (reference decoding of either coding)."""
        self._check_payload(payload)
        if self.coding == "fixed":
            return reference_unpack_fixed(payload.buffers["packed"], payload.numel, self.s)
        return reference_elias_decode(payload.buffers["nbits"], payload.buffers["stream"], payload.numel,
                                      self.s, self.bucket)

    # -- a bucket at once ----------------------------------------------------------
    def bucket_ops(self, devices: Sequence[torch.device]) -> bool:
        """The device kernels' bucket ops (``qsgd_encode_fixed_many`` / ``qsgd_encode_elias_many``,
        ``qsgd_decode_fixed_many``, ``qsgd_decode_elias_many``: a fixed number of device calls per
        dtype whatever the tensor count)."""
        return self.on_device_kernels(devices)

    def encode_many(self, tensors, residuals=None, options=None, positions=None) -> List[Payload]:
        """See :meth:`Codec.encode_many`: tensor i's key is the one :meth:`encode` would draw after
        ``reset_stream(positions[i])`` (None: the next position), and the stream advances as
        ``len(tensors)`` encode calls would leave it."""
        if (not self.bucket_ops([t.device for t in tensors]) or residuals is not None
                or (options is not None and any(options))):
            return super().encode_many(tensors, residuals, options, positions)  # (refuses what encode refuses)
        keys = []
        for i, t in enumerate(tensors):
            check_float("qsgd", t)
            if positions is not None:
                self.reset_stream(positions[i])
            keys.append(stream_key(self.seed, self.rank_stream, self.next_position()))
        flats = [t.reshape(-1).contiguous() for t in tensors]
        max_norm = self.norm == "max"
        if self.coding == "fixed":
            norms, packed = self._C.qsgd_encode_fixed_many(flats, self.s, self.bucket, max_norm, keys)
            bufs = [{"norms": a, "packed": b} for a, b in zip(norms, packed)]
        else:
            norms, nbits, streams = self._C.qsgd_encode_elias_many(flats, self.s, self.bucket, max_norm, keys,
                                                                   group_buckets(self.bucket))
            bufs = [{"norms": a, "nbits": b, "stream": c} for a, b, c in zip(norms, nbits, streams)]
        return [Payload(b, t.shape, t.dtype, t.device) for b, t in zip(bufs, tensors)]

    def _one_k(self, ks) -> int:
        """The K shared by a bucket's tensors (their payloads come from the same K ranks)."""
        ks = set(ks)
        if len(ks) != 1:
            raise ValueError(f"qsgd: a bucket's payloads come from one K ranks, got K = {sorted(ks)}")
        return ks.pop()

    def decode_mean_stacked_many(self, stacked, scale=None, outs=None) -> List[torch.Tensor]:
        """See :meth:`Codec.decode_mean_stacked_many` (fixed coding: one bucket op; Elias: the
        per-tensor path)."""
        outs = list(outs) if outs is not None else [None] * len(stacked)
        if self.coding != "fixed" or not self.bucket_ops([p.device for p in stacked]):
            return super().decode_mean_stacked_many(stacked, scale, outs)
        k = self._one_k(self._check_payload(p, stacked=True) for p in stacked)
        scale = 1.0 / k if scale is None else scale
        flat_outs = [self.flat_out(o, p) for o, p in zip(outs, stacked)]
        flats = self._C.qsgd_decode_fixed_many(
            [p.buffers["norms"] for p in stacked], [p.buffers["packed"] for p in stacked], [p.numel for p in stacked],
            self.s, self.bucket, [p.dtype for p in stacked], float(scale), flat_outs)
        return [f.view(p.shape) if o is None else o for f, p, o in zip(flats, stacked, outs)]

    def decode_mean_list_many(self, payloads, scale=None, outs=None) -> List[torch.Tensor]:
        """See :meth:`Codec.decode_mean_list_many` (Elias coding: one bucket op with
        :meth:`Codec.decode_mean_list`'s arithmetic; fixed: the per-tensor path)."""
        outs = list(outs) if outs is not None else [None] * len(payloads)
        devices = [p.device for ps in payloads for p in ps]
        if self.coding != "elias" or not self.bucket_ops(devices):
            return super().decode_mean_list_many(payloads, scale, outs)
        firsts, ks = [], []
        for ps, o in zip(payloads, outs):
            first, k = check_payload_list(self.name, ps)
            self.check_out(o, first)
            for p in ps:
                self._check_payload(p)
            firsts.append(first)
            ks.append(k)
        k = self._one_k(ks)
        scale = 1.0 / k if scale is None else scale
        flat_outs = [self.flat_out(o, p) for o, p in zip(outs, firsts)]
        buffers = {name: [[p.buffers[name] for p in ps] for ps in payloads] for name in ("norms", "nbits", "stream")}
        flats = self._C.qsgd_decode_elias_many(
            buffers["norms"], buffers["nbits"], buffers["stream"], [p.numel for p in firsts], self.s, self.bucket,
            group_buckets(self.bucket), [p.dtype for p in firsts], float(scale), flat_outs)
        return [f.view(p.shape) if o is None else o for f, p, o in zip(flats, firsts, outs)]

    # -- decode -------------------------------------------------------------------
    def _check_payload(self, payload: Payload, stacked: bool = False) -> int:
        """Buffers, dtypes and lengths (the Elias stream's length: by the decoders); returns K."""
        if self.coding == "fixed":
            return check_fixed(self, payload, stacked)
        n = payload.numel
        specs = [("norms", torch.float32, num_buckets(n, self.bucket)),
                 ("nbits", torch.int64, num_groups(n, self.bucket)), ("stream", torch.uint8, None)]
        return check_buffers(self.name, payload, specs, stacked)

    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._check_payload(payload)
        n = payload.numel
        norms = payload.buffers["norms"]
        if self.uses_kernels:
            fo = self.flat_out(out, payload)
            if self.coding == "fixed":
                flat = self._C.qsgd_decode_fixed(norms, payload.buffers["packed"], n, self.s, self.bucket,
                                                 payload.dtype, 1.0, fo)
            else:
                flat = self._C.qsgd_decode_elias(norms, payload.buffers["nbits"], payload.buffers["stream"], n,
                                                 self.s, self.bucket, group_buckets(self.bucket), payload.dtype, fo)
            return flat.view(payload.shape)
        self.check_out(out, payload)
        q = self.levels_of(payload).to(norms.device)
        flat = reference_values(q, norms, self.s, self.bucket, payload.dtype)
        if out is not None:
            return out.copy_(flat.view(payload.shape))
        return flat.view(payload.shape)

    def decode_mean_stacked(self, stacked: Payload, scale: float | None = None,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``scale * sum_k decode(payload_k)`` (fixed coding, native: one fused pass over the
        K payloads; otherwise the base class's loop). ``scale`` defaults to 1/K."""
        k = self._check_payload(stacked, stacked=True)
        if not self.uses_kernels or self.coding != "fixed":
            return super().decode_mean_stacked(stacked, scale, out)
        norms, packed = stacked.buffers["norms"], stacked.buffers["packed"]
        scale = 1.0 / k if scale is None else scale
        flat = self._C.qsgd_decode_fixed(norms, packed, stacked.numel, self.s, self.bucket, stacked.dtype,
                                         float(scale), self.flat_out(out, stacked))
        return flat.view(stacked.shape)
