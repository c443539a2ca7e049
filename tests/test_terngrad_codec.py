"""The terngrad codec's contract, for both implementations (native and reference).

Expected values are computed independently here (numpy unpacking, hand-built bytes,
statistics of many draws), never with the library's own packing helpers.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload

pytestmark = pytest.mark.timeout(120)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

# sizes 0, 1, 7, 8k+1 (297 = 8*37+1, 40001 = 8*5000+1: several threads) as 1-D / 2-D / 4-D
SHAPES = [
    (), (0,), (1,), (7,), (297,), (40001,),
    (0, 5), (1, 1), (1, 7), (3, 99), (13, 3077),
    (0, 2, 3, 3), (1, 1, 1, 1), (7, 1, 1, 1), (3, 11, 3, 3), (13, 17, 181, 1),
]


def _dtype_id(d):
    return str(d).replace("torch.", "")


def _shape_id(s):
    return "x".join(map(str, s)) if len(s) else "scalar"


dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
shapes = pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)


def _grad(shape, dtype, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if t.numel() > 3:
        t.view(-1)[::5] = 0.0  # exact zeros must encode as 0
    return t.to(dtype)


def _np_values(codes: torch.Tensor, n: int) -> np.ndarray:
    """2-bit codes unpacked with numpy -> int codes[n] in 0..3 (not mapped to values)."""
    b = codes.cpu().numpy().astype(np.uint8)
    c = np.stack([(b >> s) & 3 for s in (0, 2, 4, 6)], axis=1).reshape(-1)
    return c[:n], c[n:]


def _codec(impl, **kw):
    return hgc.get_codec("terngrad", impl=impl, **kw)


# -- interface ------------------------------------------------------------------------------

def test_registered():
    c = hgc.get_codec("terngrad")
    assert type(c).__name__ == "TernGradCodec" and c.name == "terngrad" and c.impl == "native"
    assert c.shared_scale is True and c.fuses_feedback is False
    assert "terngrad" in hgc.available_codecs()
    # the same on every rank (the adapter compares it across ranks): no rank_stream in it
    assert repr(hgc.get_codec("terngrad", rank_stream=0)) == repr(hgc.get_codec("terngrad", rank_stream=3))


@shapes
@dtypes
@pytest.mark.parametrize("impl", ["native", "reference"])
def test_payload_values_and_layout(shape, dtype, impl):
    codec = _codec(impl, seed=3)
    g = _grad(shape, dtype, seed=1)
    n = g.numel()
    p = codec.encode(g)
    assert list(p.buffers) == ["codes", "scale"]
    assert [(k, b.dtype, b.numel()) for k, b in p.buffers.items()] == codec.layout(shape, dtype)
    assert p.nbytes == (n + 3) // 4 + 4 == codec.payload_nbytes(shape, dtype)
    s = p.buffers["scale"].item()
    gd = g.double()
    assert s == (gd.abs().max().item() if n else 0.0) or dtype == torch.float64
    if dtype == torch.float64 and n:
        m = gd.abs().max().item()
        assert m <= s and s == float(np.float32(s)) and float(np.nextafter(np.float32(s), np.float32(0))) < m
    assert s == codec.local_scale(g)
    codes, pad = _np_values(p.buffers["codes"], n)
    assert (pad == 0).all() and not (codes == 3).any()
    flat = gd.reshape(-1).numpy()
    assert ((codes == 0) | ((codes == 1) & (flat > 0)) | ((codes == 2) & (flat < 0))).all()
    assert (codes[flat == 0] == 0).all()
    if n:
        assert (codes[np.abs(flat) == np.abs(flat).max()] != 0).all()  # |g| == s: always sent
    d = codec.decode(p)
    assert d.shape == g.shape and d.dtype == dtype
    expected = np.select([codes == 1, codes == 2], [s, -s], 0.0)
    np.testing.assert_array_equal(d.double().reshape(-1).numpy(),
                                  torch.from_numpy(expected).to(dtype).double().numpy())
    out = torch.full(shape, 7.0, dtype=dtype)
    assert codec.decode(p, out=out) is not None
    assert torch.equal(out, d)


@pytest.mark.parametrize("impl", ["native", "reference"])
@dtypes
def test_packing_hand_checked(impl, dtype):
    s = 0.75
    g = torch.tensor([s, 0, -s, s, -s, 0, 0, s, -s], dtype=dtype)
    for scale in (None, s):
        p = _codec(impl, seed=11, rank_stream=5).encode(g, scale=scale)
        # codes 1,0,2,1 | 2,0,0,1 | 2,pad,pad,pad
        assert p.buffers["codes"].tolist() == [1 | 2 << 4 | 1 << 6, 2 | 1 << 6, 2]
        assert p.buffers["scale"].tolist() == [s] and p.buffers["scale"].dtype == torch.float32
        assert p.nbytes == 3 + 4


@pytest.mark.parametrize("impl", ["native", "reference"])
def test_zero_gradient_and_zero_scale(impl):
    codec = _codec(impl)
    g = torch.zeros(13)
    p = codec.encode(g)
    assert p.buffers["scale"].item() == 0.0 and p.buffers["codes"].tolist() == [0] * 4
    p = codec.encode(torch.randn(13), scale=0.0)
    assert p.buffers["codes"].tolist() == [0] * 4
    assert torch.equal(codec.decode(p), torch.zeros(13))


# -- native == reference --------------------------------------------------------------------

@shapes
@dtypes
@pytest.mark.parametrize("clip", [None, 2.5])
def test_native_matches_reference(shape, dtype, clip):
    nat = _codec("native", seed=7, rank_stream=2, clip=clip)
    ref = _codec("reference", seed=7, rank_stream=2, clip=clip)
    for step in range(2):
        g = _grad(shape, dtype, seed=10 + step)
        assert nat.local_scale(g) == ref.local_scale(g)
        shared = None if step == 0 else 1.5 * ref.local_scale(g) + 1e-3
        pn, pr = nat.encode(g, scale=shared), ref.encode(g, scale=shared)
        assert torch.equal(pn.buffers["codes"], pr.buffers["codes"])
        assert torch.equal(pn.buffers["scale"], pr.buffers["scale"])
        assert torch.equal(nat.decode(pn), ref.decode(pr))
        assert torch.equal(ref.decode(pn), nat.decode(pr))


# -- statistics -----------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("clip", [None, 1.5])
def test_unbiased(impl, dtype, clip):
    """The mean of N encodes approaches the (clipped) gradient within 5 sigma of the mean."""
    N, n = 2000, 301
    g = _grad((n,), dtype, seed=4)
    g[0] = 0.0
    codec = _codec(impl, seed=123, rank_stream=1, clip=clip)
    gd = g.double()
    s = codec.local_scale(g)
    if clip is not None:
        assert s == pytest.approx(clip * gd.std(correction=0).item(), rel=1e-6) and s < gd.abs().max().item()
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(N):
        p = codec.encode(g)
        assert p.buffers["scale"].item() == s
        total += codec.decode(p).double()
    mean = total / N
    # decoded values are +-s rounded to the gradient dtype: E[mean] = clamp(g, -s, s) * s_d / s
    s_d = torch.tensor(s, dtype=dtype).double().item()
    a = gd.abs().clamp(max=s)
    target = torch.sign(gd) * a * (s_d / s)
    var = (s * a - a * a).clamp(min=0)
    bound = 5 * torch.sqrt(var / N) + 1e-6 * s
    err = (mean - target).abs()
    assert (err <= bound).all(), f"worst {((err - bound) / s).max().item():.3g} of s over the bound"
    # and it does vary: not a deterministic rounding
    assert (var > 0).sum() > n // 2 and (err > 0).sum() > n // 4


# -- decode_mean_stacked ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (297,), (3, 99), (13, 17, 181, 1)], ids=_shape_id)
@dtypes
@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("shared", [True, False])
def test_decode_mean(shape, dtype, impl, shared, stack_payloads):
    K = 3
    grads = [_grad(shape, dtype, seed=20 + k, scale=1.0 + k) for k in range(K)]
    codecs = [_codec(impl, seed=1, rank_stream=k) for k in range(K)]
    s = max(c.local_scale(g) for c, g in zip(codecs, grads)) if shared else None
    payloads = [c.encode(g, scale=s) for c, g in zip(codecs, grads)]
    scales = [p.buffers["scale"].item() for p in payloads]
    if grads[0].numel() and not shared:
        assert len(set(scales)) == K
    stacked = stack_payloads(payloads)
    codec = codecs[0]
    singles = [codec.decode(p).double() for p in payloads]
    for scale in (None, 0.25):
        w = 1.0 / K if scale is None else scale
        expected = sum(singles) * w
        got = codec.decode_mean_stacked(stacked, scale)
        assert got.shape == grads[0].shape and got.dtype == dtype
        eps = torch.finfo(dtype).eps  # float32 sums, one rounding to dtype
        tol = dict(rtol=4 * eps, atol=0 if shared else 4 * eps * max(scales + [0.0]))
        torch.testing.assert_close(got.double(), expected, **tol)
        out = torch.empty(shape, dtype=dtype)
        codec.decode_mean_stacked(stacked, scale, out=out)
        assert torch.equal(out, got)
        other = _codec("reference" if impl == "native" else "native")
        assert torch.equal(other.decode_mean_stacked(stacked, scale), got)


def test_decode_mean_many_payloads_integer_sum(stack_payloads):
    """K = 40 ranks sharing s: the integer sum of codes times s/K, exactly."""
    K, n = 40, 1001
    g = _grad((n,), torch.float32, seed=5)
    s = _codec("reference").local_scale(g)
    payloads = [_codec("native", seed=9, rank_stream=k).encode(g, scale=s) for k in range(K)]
    codes = np.stack([_np_values(p.buffers["codes"], n)[0] for p in payloads])
    ints = (codes == 1).sum(0) - (codes == 2).sum(0)
    expected = torch.from_numpy(ints.astype(np.float32)) * np.float32(s / K)
    for impl in ("native", "reference"):
        assert torch.equal(_codec(impl).decode_mean_stacked(stack_payloads(payloads)), expected)


# -- clipping -------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=_dtype_id)
def test_clip(impl, dtype):
    g = _grad((1000,), dtype, seed=8)
    g[3], g[10] = 40.0, -30.0
    codec = _codec(impl, clip=2.5)
    sigma = g.double().std(correction=0).item()
    t = 2.5 * sigma
    assert g.double().abs().max().item() > t
    s = codec.local_scale(g)
    assert s == pytest.approx(t, rel=1e-6)
    assert s == float(np.float32(s))  # a float32 value, ~ clip * sigma (sigma computed in float32)
    for _ in range(5):
        p = codec.encode(g)
        assert p.buffers["scale"].item() == s
        d = codec.decode(p)
        s_d = torch.tensor(s, dtype=dtype).item()  # decoded in the gradient dtype
        assert d[3].item() == s_d and d[10].item() == -s_d  # clipped to t = s: always sent
    # a shared scale above the local clip threshold: clipped values are sent with prob t/s
    big = 2 * s
    hits = sum(int(_codec(impl, clip=2.5, seed=k).encode(g, scale=big).buffers["codes"][0].item() >> 6 & 3 == 1)
               for k in range(400))
    assert abs(hits / 400 - 0.5) < 5 * math.sqrt(0.25 / 400)
    # without clip the scale is the max
    assert _codec(impl).local_scale(g) == 40.0
    # a constant tensor (sigma 0) is not clipped
    assert _codec(impl, clip=2.5).local_scale(torch.full((5,), -2.0, dtype=dtype)) == 2.0
    assert _codec(impl, clip=2.5).local_scale(torch.tensor([3.0], dtype=dtype)) == 3.0


# -- streams --------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["native", "reference"])
def test_streams(impl):
    g = _grad((4096,), torch.float32, seed=2)
    s = 2.0 * g.abs().max().item()

    def run(**kw):
        c = _codec(impl, **kw)
        return [c.encode(g, scale=s).buffers["codes"] for _ in range(3)]

    a, b = run(seed=1, rank_stream=0), run(seed=1, rank_stream=0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))          # same seed + stream: identical
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])  # advances per call
    for other in (run(seed=1, rank_stream=1), run(seed=2, rank_stream=0)):
        for x, y in zip(a, other):
            frac = (x != y).float().mean().item()
            assert frac > 0.3, frac                                   # different streams differ


# -- bad inputs -----------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["native", "reference"])
def test_bad_inputs(impl):
    codec = _codec(impl)
    for bad in (torch.arange(5), torch.ones(3, dtype=torch.int32), torch.ones(2, dtype=torch.bool)):
        with pytest.raises(TypeError):
            codec.encode(bad)
        with pytest.raises(TypeError):
            codec.local_scale(bad)
    g = torch.randn(10)
    with pytest.raises(ValueError):
        codec.encode(g, residual=torch.zeros(10))
    with pytest.raises(ValueError):
        codec.encode(g, scale=-1.0)
    with pytest.raises(ValueError):
        _codec(impl, clip=0.0)
    with pytest.raises(ValueError):
        _codec(impl, clip=-2.5)
    with pytest.raises(ValueError):
        hgc.get_codec("terngrad", impl="fast")
    p = codec.encode(g)
    with pytest.raises(ValueError):
        codec.decode(p, out=torch.empty(11))
    with pytest.raises(ValueError):
        codec.decode(p, out=torch.empty(10, dtype=torch.float64))
    empty = Payload({"codes": torch.zeros(0, 3, dtype=torch.uint8), "scale": torch.zeros(0, 1)},
                    torch.Size([10]), torch.float32)
    with pytest.raises(ValueError):
        codec.decode_mean_stacked(empty)


def test_native_kernel_checks():
    C = hgc.native.require_native()
    g = torch.randn(9)
    with pytest.raises(RuntimeError):
        C.terngrad_encode(g, -1.0, math.inf, 0, 0)
    with pytest.raises(RuntimeError):
        C.terngrad_encode(g[::2], 1.0, math.inf, 0, 0)
    codes = torch.zeros(1, 2, dtype=torch.uint8)
    with pytest.raises(RuntimeError):
        C.terngrad_decode_sum(codes, torch.ones(1, 1), 9, torch.float32, 1.0)  # 9 values need 3 bytes


# -- devices --------------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_reference_and_native_error():
    g = _grad((1001,), torch.float32, seed=1).cuda()
    ref = _codec("reference", seed=4)
    p = ref.encode(g)
    cpu = _codec("reference", seed=4).encode(g.cpu())
    assert torch.equal(p.buffers["codes"].cpu(), cpu.buffers["codes"])
    assert ref.decode(p).device == g.device
    with pytest.raises(RuntimeError, match="without CUDA kernels for terngrad"):
        _codec("native").encode(g)


def test_warmup_steps_option():
    """``warmup_steps=N``: the exchange's dense pattern for the first N steps (as onebit's);
    named in the repr only when set (older checkpoints' reprs unchanged)."""
    from horovod_gradcomp.codecs.terngrad import TernGradCodec
    assert "warmup_steps" not in repr(TernGradCodec(impl="reference"))
    assert "warmup_steps=100" in repr(TernGradCodec(impl="reference", warmup_steps=100))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="warmup_steps must be an int >= 0"):
            TernGradCodec(impl="reference", warmup_steps=bad)
