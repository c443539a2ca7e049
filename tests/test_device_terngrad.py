"""TernGrad's device path (csrc/device/terngrad_*) on the OpenMP twin, against the CPU kernels.

Beyond tests/test_cuda_codecs.py: the clip's sigma (one fixed summation order: CPU kernel ==
twin == the torch reference, bitwise, at 1, 2 and 4 threads), payloads with clipping at several
thread counts, the two-phase owner's exact sums (K = 1..8 and the largest K of 16-bit fields),
and the number of device algorithm calls per op.
"""
from __future__ import annotations

import math
import struct

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.codecs.ternary_sum import MAX_K, TernarySumCodec, level_width
from horovod_gradcomp.codecs.terngrad import clip_sigma
from horovod_gradcomp.native import require_native

from device_helpers import DTYPES, THREADS, device_calls, dtype_id, threads, twin  # noqa: F401 (fixtures)


def _grad(n, dtype, seed=0, mean=0.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=gen, dtype=torch.float64) * 0.7 + mean).to(dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1).contiguous().view(torch.uint8)


def _f64_bits(v: float) -> bytes:
    return struct.pack("<d", v)


# -- the clip's sigma: one fixed order everywhere ----------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [1, 2, 7, 255, 257, 65535, 65536, 65537, 300_001, (1 << 20) + 3])
def test_sigma_cpu_twin_reference_bitwise(twin, threads, dtype, n):
    C = require_native()
    g = _grad(n, dtype, seed=n, mean=3.0)  # a mean far from 0: the two-pass order matters
    want = _f64_bits(clip_sigma(g))
    for t in THREADS:
        threads(t)
        assert _f64_bits(C.terngrad_sigma(g)) == want, f"CPU kernel at {t} threads"
        assert _f64_bits(twin.terngrad_sigma(g)) == want, f"twin at {t} threads"
    exact = g.double().std(correction=0).item()
    assert clip_sigma(g) == pytest.approx(exact, rel=1e-12, abs=1e-300)


def test_sigma_special_values(twin):
    C = require_native()
    for g in (torch.full((1000,), -2.5), torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([1.0, float("inf")]),
              torch.zeros(70000, dtype=torch.float16), torch.tensor([-0.0, -0.0])):
        want = clip_sigma(g)
        assert _f64_bits(C.terngrad_sigma(g)) == _f64_bits(want)
        assert _f64_bits(twin.terngrad_sigma(g)) == _f64_bits(want)
    assert C.terngrad_sigma(torch.empty(0)) == twin.terngrad_sigma(torch.empty(0)) == 0.0


def test_max_abs_special_values(twin):
    C = require_native()
    for g in (torch.tensor([-0.0, -0.0]), torch.tensor([1.0, -3.0, 2.0]), torch.empty(0),
              torch.tensor([1.0, float("nan"), -5.0]), torch.tensor([float("-inf"), 1.0])):
        want, got = C.terngrad_max_abs(g), twin.terngrad_max_abs(g)
        assert (math.isnan(want) and math.isnan(got)) or _f64_bits(want) == _f64_bits(got), (g, want, got)
    assert _f64_bits(twin.terngrad_max_abs(torch.tensor([-0.0]))) == _f64_bits(0.0)


@pytest.mark.parametrize("clip", [None, 2.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [33, 8001, (1 << 20) + 3])
def test_payload_same_at_every_thread_count(twin, threads, dtype, n, clip):
    g = _grad(n, dtype, seed=5)
    g[::97] *= 8  # outliers for the clip to cut
    want = None
    for t in THREADS:
        threads(t)
        for impl in ("native", "twin"):
            codec = hgc.get_codec("terngrad", impl=impl, seed=2, rank_stream=1, clip=clip)
            p = codec.encode(g)
            got = (_bits(p.buffers["codes"]), _bits(p.buffers["scale"]))
            if want is None:
                want = got
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{impl} at {t} threads"
    ref = hgc.get_codec("terngrad", impl="reference", seed=2, rank_stream=1, clip=clip).encode(g)
    assert torch.equal(_bits(ref.buffers["codes"]), want[0]) and torch.equal(_bits(ref.buffers["scale"]), want[1])


# -- decode-sums -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("k", range(1, 9))
def test_decode_sum_twin_equals_cpu_for_many_scales(twin, threads, k, dtype):
    """K payloads of random codes (code 3 included) with one shared scale (the integer path) and
    with K different scales (the weighted path), for many scales and output scales."""
    C = require_native()
    n = 1001
    gen = torch.Generator().manual_seed(k)
    codes = torch.randint(0, 256, (k, (n + 3) // 4 + 2), generator=gen, dtype=torch.uint8)[:, 1:]
    for j in range(40):
        s = float(torch.rand((), generator=gen, dtype=torch.float64) * 10 ** (j % 7 - 3))
        shared = torch.full((k, 1), s, dtype=torch.float32)
        weighted = (torch.rand(k, 1, generator=gen) * s).float()
        for scales in (shared, weighted):
            for scale in (1.0 / k, 1.0 / 3, 0.7):
                want = C.terngrad_decode_sum(codes, scales, n, dtype, scale)
                threads(1 + j % 4)
                got = twin.terngrad_decode_sum(codes, scales, n, dtype, scale)
                assert torch.equal(_bits(got), _bits(want)), (s, scale, scales[:, 0].tolist())


# -- the two-phase owner's exact sums ------------------------------------------------------------

def _stacked(k, n, dtype, seed=0, scale=1.5):
    codec = hgc.get_codec("terngrad", impl="native", seed=seed, rank_stream=0)
    payloads = [codec.encode(_grad(n, dtype, seed=seed + j), scale=scale) for j in range(k)]
    bufs = {name: torch.stack([p.buffers[name] for p in payloads]) for name in payloads[0].buffers}
    return codec, Payload(bufs, payloads[0].shape, dtype, torch.device("cpu"))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 33, 8001])
def test_owner_sums_twin_equal_cpu(twin, threads, k, n, dtype):
    ternary, stacked = _stacked(k, n, dtype, seed=k)
    cpu, dev, ref = TernarySumCodec(k, "native"), TernarySumCodec(k, "twin"), TernarySumCodec(k, "reference")
    want = cpu.encode_stacked(ternary, stacked)
    want_dec = cpu.decode(want)
    for t in THREADS:
        threads(t)
        got = dev.encode_stacked(ternary, stacked)
        assert torch.equal(got.buffers["levels"], want.buffers["levels"]), f"levels at {t} threads"
        assert torch.equal(_bits(dev.decode(got)), _bits(want_dec)), f"decode at {t} threads"
    assert torch.equal(ref.encode_stacked(ternary, stacked).buffers["levels"], want.buffers["levels"])
    # the owner's mean is the K payloads' own decode-mean
    assert torch.equal(_bits(want_dec), _bits(ternary.decode_mean_stacked(stacked)))


@pytest.mark.parametrize("codes_byte", [0b01010101, 0b10101010, 0b10010001])
def test_owner_sums_at_the_largest_k(twin, codes_byte):
    """K = MAX_K: biased sums up to 2K = 65534 in the 16-bit fields (above int16's range)."""
    k, n = MAX_K, 6
    assert level_width(k) == 16
    codes = torch.full((k, 2), codes_byte, dtype=torch.uint8)
    scales = torch.full((k, 1), 0.25, dtype=torch.float32)
    stacked = Payload({"codes": codes, "scale": scales}, torch.Size([n]), torch.float32, torch.device("cpu"))
    ternary = hgc.get_codec("terngrad", impl="reference")
    v = [((codes_byte >> (2 * (i % 4))) & 1) - ((codes_byte >> (2 * (i % 4) + 1)) & 1) for i in range(n)]
    want_fields = torch.tensor([x * k + k for x in v], dtype=torch.int32)
    mult = torch.tensor(0.25 * (1.0 / k), dtype=torch.float32)  # s * (1/K), rounded once to float32
    want_mean = torch.tensor([x * k for x in v], dtype=torch.float32) * mult
    assert torch.allclose(want_mean, torch.tensor([x * 0.25 for x in v]), rtol=1e-6)
    for impl in ("reference", "native", "twin"):
        sc = TernarySumCodec(k, impl)
        p = sc.encode_stacked(ternary, stacked)
        lv = p.buffers["levels"]
        fields = lv[0::2].to(torch.int32) | (lv[1::2].to(torch.int32) << 8)
        assert torch.equal(fields, want_fields), impl
        for dec_impl in ("reference", "native", "twin"):
            assert torch.equal(TernarySumCodec(k, dec_impl).decode(p), want_mean), (impl, dec_impl)


# -- device algorithm calls per op ---------------------------------------------------------------

@pytest.mark.parametrize("n", [5, 8001, (1 << 20) + 3])
def test_algorithm_calls_per_op_do_not_grow_with_size(twin, n):
    g = _grad(n, torch.float32, seed=1)
    codes, scales = twin.terngrad_encode(g, 1.0, math.inf, 1, 2)
    stacked_c, stacked_s = codes.expand(4, -1), scales.expand(4, -1)
    assert device_calls(twin, lambda: twin.terngrad_encode(g, 1.0, math.inf, 1, 2)) == 1
    assert device_calls(twin, lambda: twin.terngrad_decode_sum(stacked_c, stacked_s, n, torch.float32, 0.25)) == 2
    assert device_calls(twin, lambda: twin.terngrad_max_abs(g)) == 1
    levels = twin.terngrad_sum_levels(stacked_c, n, 4)
    assert device_calls(twin, lambda: twin.terngrad_sum_levels(stacked_c, n, 4)) == 1
    assert device_calls(twin, lambda: twin.terngrad_sum_decode(levels, n, 4, 4, 0.25, torch.float32)) == 1
    # two fixed-order sums: lanes, then at most two levels of blocks each
    assert 2 <= device_calls(twin, lambda: twin.terngrad_sigma(g)) <= 6


def test_twin_codec_sends_every_call_to_the_twin(twin):
    g = _grad(4001, torch.float32, seed=3)
    codec = hgc.get_codec("terngrad", impl="twin", clip=2.5)
    p = [None]
    assert device_calls(twin, lambda: p.__setitem__(0, codec.encode(g))) >= 1 + 1 + 2  # encode, max, sigma
    assert device_calls(twin, lambda: codec.decode(p[0])) == 2
