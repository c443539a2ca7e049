"""The qsgd codec's contract: native == reference bit for bit, both codings lossless and
equal, unbiasedness and the QSGD variance bound (statistically), exact payload sizes,
hand-built wire bytes, options and errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from horovod_gradcomp.codecs import get_codec
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.native import native_available

pytestmark = pytest.mark.timeout(120)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SIZES = [0, 1, 7, 8 * 1024 + 1]


def _shape(n: int, rank: int):
    if rank == 1:
        return (n,)
    if rank == 2:
        return {0: (0, 3), 1: (1, 1), 7: (7, 1)}.get(n, (3, n // 3) if n % 3 == 0 else (1, n))
    return {0: (2, 0, 3, 1), 1: (1, 1, 1, 1), 7: (1, 7, 1, 1)}.get(n, (1, n, 1, 1))


def _grad(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    t = torch.randn(n, generator=gen, dtype=torch.float64) * torch.exp(torch.randn(n, generator=gen,
                                                                                    dtype=torch.float64))
    return t.to(dtype).view(shape)


def _codec(impl, **kw):
    return get_codec("qsgd", impl=impl, **kw)


needs_native = pytest.mark.skipif(not native_available(), reason="native extension not built")


# -- native == reference, both codings decode alike -------------------------------------------

@needs_native
@pytest.mark.parametrize("norm", ["l2", "max"])
@pytest.mark.parametrize("rank", [1, 2, 4], ids=lambda r: f"{r}d")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_native_matches_reference(dtype, n, rank, norm):
    x = _grad(_shape(n, rank), dtype, seed=n + rank)
    decoded = {}
    for coding in ("fixed", "elias"):
        pay = {}
        for impl in ("native", "reference"):
            c = _codec(impl, coding=coding, norm=norm, bucket=512, seed=11, rank_stream=3)
            p = c.encode(x)
            assert list(p.buffers) == (["norms", "packed"] if coding == "fixed" else ["norms", "nbits", "stream"])
            y = c.decode(p)
            assert y.shape == x.shape and y.dtype == x.dtype
            pay[impl] = p
            decoded[(impl, coding)] = y
        for name in pay["native"].buffers:
            assert torch.equal(pay["native"].buffers[name], pay["reference"].buffers[name]), name
        # cross-decoding: the reference decodes the native payload and vice versa
        y_ref = _codec("reference", coding=coding, norm=norm).decode(pay["native"])
        y_nat = _codec("native", coding=coding, norm=norm).decode(pay["reference"])
        assert torch.equal(y_ref, y_nat)
    base = decoded[("reference", "fixed")]
    for key, y in decoded.items():
        assert torch.equal(y, base), key


@needs_native
@pytest.mark.parametrize("bucket", [1, 7, 512, 100_000])
@pytest.mark.parametrize("levels", [1, 2, 3, 7, 15, 127, 1000, (1 << 24) - 1])
def test_native_matches_reference_options(levels, bucket):
    x = _grad((8193,), torch.float32, seed=levels)
    codings = ("fixed", "elias") if levels < 1000 or bucket > 7 else ("fixed",)
    for coding in codings:
        for norm in ("l2", "max"):
            a = _codec("native", levels=levels, bucket=bucket, coding=coding, norm=norm, seed=5)
            b = _codec("reference", levels=levels, bucket=bucket, coding=coding, norm=norm, seed=5)
            for _ in range(2):  # the counter advances alike
                pa, pb = a.encode(x), b.encode(x)
                for name in pa.buffers:
                    assert torch.equal(pa.buffers[name], pb.buffers[name]), (coding, norm, name)
                assert torch.equal(a.decode(pa), b.decode(pb))


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("norm", ["l2", "max"])
def test_elias_is_lossless(impl, norm):
    if impl == "native" and not native_available():
        pytest.skip("native extension not built")
    x = _grad((4, 1000), torch.float32, seed=7)
    f = _codec(impl, coding="fixed", norm=norm, bits=3, bucket=100, seed=2)
    e = _codec(impl, coding="elias", norm=norm, bits=3, bucket=100, seed=2)
    pf, pe = f.encode(x), e.encode(x)
    assert torch.equal(f.levels_of(pf), e.levels_of(pe))
    assert torch.equal(f.decode(pf), e.decode(pe))


# -- hand-built wire bytes -----------------------------------------------------------------

def _np_pack(bits):
    return np.packbits(np.array(bits, dtype=np.uint8), bitorder="little")


@pytest.mark.parametrize("impl", ["native", "reference"])
def test_wire_bytes_by_hand(impl):
    if impl == "native" and not native_available():
        pytest.skip("native extension not built")
    # max norm 4, s = 4: r = |v| * s / 4 is an integer, so quantization is deterministic
    x = torch.tensor([4.0, -2.0, 1.0, 0.0, -0.0])
    f = _codec(impl, levels=4, norm="max", coding="fixed")
    p = f.encode(x)
    assert p.buffers["norms"].tolist() == [4.0]
    # w = 1 + 3 bits, code = sign | q << 1: 8, 5, 2, 0, 0 -> nibbles LSB first
    assert p.buffers["packed"].tolist() == [0x58, 0x02, 0x00]
    assert f.decode(p).tolist() == [4.0, -2.0, 1.0, 0.0, 0.0]
    e = _codec(impl, levels=4, norm="max", coding="elias")
    pe = e.encode(x)
    gamma = {1: [1], 2: [0, 1, 0], 4: [0, 0, 1, 0, 0]}  # N zeros, 1, N low bits LSB first
    bits = [0, 0, 1, 0, 0]                               # gamma(nnz + 1 = 4)
    bits += gamma[1] + [0] + gamma[4]                     # gap 0, +, level 4
    bits += gamma[1] + [1] + gamma[2]                     # gap 0, -, level 2
    bits += gamma[1] + [0] + gamma[1]                     # gap 0, +, level 1
    assert pe.buffers["nbits"].tolist() == [len(bits)]
    assert pe.buffers["stream"].tolist() == _np_pack(bits).tolist()
    assert e.decode(pe).tolist() == [4.0, -2.0, 1.0, 0.0, 0.0]
    # gaps: a zero run before a nonzero
    y = torch.tensor([0.0, 0.0, 0.0, 2.0])
    pe = e.encode(y)
    bits = [0, 1, 0] + [0, 0, 1, 0, 0] + [0] + [0, 0, 1, 0, 0]  # gamma(nnz+1=2), gamma(gap+1=4), +, gamma(4)
    assert pe.buffers["stream"].tolist() == _np_pack(bits).tolist()


# -- statistics -----------------------------------------------------------------------------

def _expected_var(x: torch.Tensor, s: int, d: int, max_norm: bool) -> torch.Tensor:
    """Per-element variance (||v||/s)^2 p (1 - p), float64, computed independently."""
    v = x.double().view(-1)
    out = torch.empty_like(v)
    for i in range(0, v.numel(), d):
        b = v[i:i + d]
        nrm = b.abs().max() if max_norm else b.norm()
        r = b.abs() / nrm * s
        p = r - r.floor()
        out[i:i + d] = (nrm / s) ** 2 * p * (1 - p)
    return out


@pytest.mark.parametrize("norm", ["l2", "max"])
@pytest.mark.parametrize("impl", ["native", "reference"])
def test_unbiased(impl, norm):
    if impl == "native" and not native_available():
        pytest.skip("native extension not built")
    trials = 2000 if impl == "native" else 400
    x = _grad((96,), torch.float64, seed=1)
    c = _codec(impl, levels=2, bucket=32, norm=norm, seed=123)
    acc = torch.zeros(96, dtype=torch.float64)
    for _ in range(trials):
        acc += c.decode(c.encode(x))
    mean = acc / trials
    sigma = (_expected_var(x, 2, 32, norm == "max") / trials).sqrt()
    err = (mean - x).abs()
    assert bool((err <= 5 * sigma + 1e-6 * x.abs()).all()), (err / (sigma + 1e-12)).max()


@needs_native
@pytest.mark.parametrize("s", [1, 2, 7])
@pytest.mark.parametrize("d", [7, 64, 512])
def test_variance_bound(s, d):
    x = _grad((4 * d,), torch.float32, seed=s * d)
    c = _codec("native", levels=s, bucket=d, norm="l2", seed=9)
    trials = 300
    sq = torch.zeros(4, dtype=torch.float64)
    for _ in range(trials):
        e = (c.decode(c.encode(x)).double() - x.double()).view(4, d)
        sq += (e * e).sum(1)
    emp = sq / trials
    exact = _expected_var(x, s, d, False).view(4, d).sum(1)
    nrm2 = x.double().view(4, d).pow(2).sum(1)
    bound = min(d / s ** 2, math.sqrt(d) / s) * nrm2
    assert bool((exact <= bound).all())
    # the empirical mean of a sum of bounded terms is within a few percent of its expectation
    assert bool((emp <= bound * 1.05 + 1e-9).all()), (emp / bound)
    assert bool(((emp - exact).abs() <= 0.25 * exact + 1e-9).all()), (emp, exact)


# -- sizes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("bits,bucket", [(2, 1), (3, 7), (4, 512), (5, 512), (8, 100), (9, 10_000)])
@pytest.mark.parametrize("n", SIZES)
def test_payload_nbytes(impl, n, bits, bucket):
    if impl == "native" and not native_available():
        pytest.skip("native extension not built")
    x = _grad((n,), torch.float32, seed=bits)
    s = (1 << (bits - 1)) - 1
    w = 1 + s.bit_length()
    assert w == bits
    nb = -(-n // bucket)
    f = _codec(impl, bits=bits, bucket=bucket)
    p = f.encode(x)
    assert p.nbytes == 4 * nb + -(-n * w // 8)
    assert f.layout((n,), torch.float32) == [("norms", torch.float32, nb), ("packed", torch.uint8, -(-n * w // 8))]
    assert f.payload_nbytes((n,), torch.float32) == p.nbytes
    assert not f.variable_size
    if impl == "reference" and n > 1000:
        return  # the reference Elias decoder is a slow Python parser
    e = _codec(impl, bits=bits, bucket=bucket, coding="elias")
    pe = e.encode(x)
    groups = max(1, -(-nb // max(1, -(-65536 // bucket))))
    nbits = pe.buffers["nbits"]
    assert nbits.dtype == torch.int64 and nbits.numel() == groups
    assert pe.nbytes == 4 * nb + 8 * groups + sum(-(-int(b) // 8) for b in nbits)
    assert e.variable_size
    with pytest.raises(NotImplementedError, match="variable"):
        e.layout((n,), torch.float32)


@needs_native
def test_elias_smaller_at_low_levels():
    x = _grad((100_000,), torch.float32, seed=3)
    f = _codec("native", bits=4)
    e = _codec("native", bits=4, coding="elias")
    pf, pe = f.encode(x), e.encode(x)
    assert pe.nbytes < 0.6 * pf.nbytes
    assert torch.equal(f.decode(pf), e.decode(pe))
    assert pe.buffers["nbits"].numel() == 2  # groups of 128 buckets of 512


# -- options, streams, edge cases -----------------------------------------------------------

def test_options():
    assert _codec("reference").s == 7 and _codec("reference").width == 4
    assert _codec("reference", bits=2).s == 1
    assert _codec("reference", bits=8).s == 127
    assert _codec("reference", levels=3).width == 3
    assert _codec("reference", levels=4).width == 4
    c = get_codec("qsgd", impl="reference")
    assert c.fuses_feedback is False and c.bucket == 512 and c.norm == "l2" and c.coding == "fixed"


@pytest.mark.parametrize("kw,match", [
    (dict(bits=4, levels=7), "not both"),
    (dict(levels=0), "levels"),
    (dict(levels=-1), "levels"),
    (dict(bits=1), "bits"),
    (dict(bits=40), "bits"),
    (dict(bucket=0), "bucket"),
    (dict(norm="l1"), "norm"),
    (dict(coding="huffman"), "coding"),
    (dict(impl="fast"), "impl"),
    (dict(levels=2.5), "int"),
])
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        get_codec("qsgd", **{"impl": "reference", **kw})


@pytest.mark.parametrize("impl", ["native", "reference"])
def test_bad_inputs(impl):
    if impl == "native" and not native_available():
        pytest.skip("native extension not built")
    c = _codec(impl)
    with pytest.raises(TypeError, match="fp16"):
        c.encode(torch.arange(10))
    with pytest.raises(ValueError, match="error feedback"):
        c.encode(torch.ones(10), residual=torch.zeros(10))


@pytest.mark.parametrize("coding", ["fixed", "elias"])
@pytest.mark.parametrize("impl", ["native", "reference"])
def test_zero_and_special(impl, coding):
    if impl == "native" and not native_available():
        pytest.skip("native extension not built")
    c = _codec(impl, coding=coding, bucket=4)
    z = torch.zeros(10)
    p = c.encode(z)
    assert torch.equal(p.buffers["norms"], torch.zeros(3))
    assert torch.equal(c.decode(p), z)
    # a zero bucket among nonzero ones
    x = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, -2.0, 3.0, 0.5])
    y = c.decode(c.encode(x))
    assert torch.equal(y[:4], torch.zeros(4))
    assert bool((y[4:] * x[4:] >= 0).all())
    out = torch.empty(8)
    assert c.decode(c.encode(x), out=out) is not None and out.shape == (8,)


@needs_native
def test_malformed_elias_stream():
    x = _grad((3000,), torch.float32)
    for impl, err in (("native", RuntimeError), ("reference", ValueError)):
        c = _codec(impl, coding="elias")
        p = c.encode(x)
        bad = dict(p.buffers)
        bad["nbits"] = p.buffers["nbits"] - 3
        bad["stream"] = p.buffers["stream"][: -(-int(bad["nbits"][0]) // 8)]
        with pytest.raises(err, match="malformed|Elias"):
            c.decode(Payload(bad, p.shape, p.dtype))
        trunc = dict(p.buffers)
        trunc["stream"] = p.buffers["stream"][:-1]
        with pytest.raises(err):
            c.decode(Payload(trunc, p.shape, p.dtype))


@pytest.mark.parametrize("impl", ["native", "reference"])
def test_streams(impl):
    if impl == "native" and not native_available():
        pytest.skip("native extension not built")
    x = _grad((4096,), torch.float32)
    a0 = _codec(impl, seed=1, rank_stream=0)
    a0b = _codec(impl, seed=1, rank_stream=0)
    a1 = _codec(impl, seed=1, rank_stream=1)
    b0 = _codec(impl, seed=2, rank_stream=0)
    p = a0.encode(x)
    assert torch.equal(p.buffers["packed"], a0b.encode(x).buffers["packed"])
    assert not torch.equal(p.buffers["packed"], a1.encode(x).buffers["packed"])
    assert not torch.equal(p.buffers["packed"], b0.encode(x).buffers["packed"])
    assert not torch.equal(p.buffers["packed"], a0.encode(x).buffers["packed"])  # counter advanced
    a0.reset_stream()
    assert torch.equal(p.buffers["packed"], a0.encode(x).buffers["packed"])


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_decode_mean(dtype):
    k, shape = 3, (5, 301)
    nat = _codec("native", bits=3, bucket=64)
    ref = _codec("reference", bits=3, bucket=64)
    pays = [nat.encode(_grad(shape, dtype, seed=i)) for i in range(k)]
    stacked = Payload({n: torch.stack([p.buffers[n] for p in pays]) for n in pays[0].buffers}, pays[0].shape, dtype)
    got = nat.decode_mean_stacked(stacked)
    want = ref.decode_mean_stacked(stacked)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    out = torch.empty(shape, dtype=dtype)
    nat.decode_mean_stacked(stacked, scale=1.0, out=out)
    torch.testing.assert_close(out.double(), sum(nat.decode(p).double() for p in pays), rtol=tol * 4, atol=tol * 4)


@needs_native
def test_native_rejects_cuda_like_and_dtype_out():
    c = _codec("native")
    p = c.encode(torch.ones(10))
    with pytest.raises(ValueError, match="out"):
        c.decode(p, out=torch.empty(10, dtype=torch.float64))
