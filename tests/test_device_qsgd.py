"""QSGD's device path (csrc/device/qsgd_*) on the OpenMP twin, against the CPU kernels.

Beyond tests/test_cuda_codecs.py: every option (levels, bucket sizes, l2 / max norm, fixed /
Elias coding) bitwise against the CPU kernels at 1, 2 and 4 threads, K = 1..8 decode-sums, the
Elias stream's shared bytes (buckets shorter than a byte), malformed streams refused with the
CPU's messages, and the number of device algorithm calls per op.
"""
from __future__ import annotations

import pytest
import torch

from horovod_gradcomp.codecs.qsgd import group_buckets
from horovod_gradcomp.native import require_native

from device_helpers import DTYPES, THREADS, device_calls, dtype_id, outcome, threads, twin  # noqa: F401 (fixtures)

KEY = 0x1234_5678_9ABC_DEF0 - (1 << 63)  # a key with the sign bit set (two's complement)


def _grad(n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen, dtype=torch.float64) * 0.7
    if n > 10:
        g[:: 7] = 0.0  # zeros and runs of zeros for the Elias gaps
        g[3] = 5.0
    return g.to(dtype)


def _same(a, b, what):
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()
    assert a.dtype == b.dtype and a.numel() == b.numel(), f"{what}: {a.dtype}[{a.numel()}] vs {b.dtype}[{b.numel()}]"
    ab, bb = a.view(torch.uint8), b.view(torch.uint8)
    if not torch.equal(ab, bb):
        diff = (ab != bb).nonzero()
        raise AssertionError(f"{what}: {diff.numel()} bytes differ, first at {int(diff[0])}")


OPTIONS = [  # (levels s, bucket, max_norm)
    (1, 512, False), (3, 7, False), (15, 512, False), (15, 100, True), (127, 33, False), (255, 1, True),
    (1000, 2048, False), ((1 << 24) - 1, 64, True), (7, 100_000, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [0, 1, 7, 31, 33, 8001, 70_001])
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: f"s{o[0]}-d{o[1]}-{'max' if o[2] else 'l2'}")
def test_fixed_twin_equals_cpu(twin, threads, opt, n, dtype):
    C = require_native()
    s, d, max_norm = opt
    g = _grad(n, dtype, seed=n + s)
    norms, packed = C.qsgd_encode_fixed(g, s, d, max_norm, KEY)
    want = C.qsgd_decode_fixed(norms, packed, n, s, d, dtype, 1.0)
    for t in THREADS:
        threads(t)
        tn, tp = twin.qsgd_encode_fixed(g, s, d, max_norm, KEY)
        _same(tn, norms, f"norms at {t} threads")
        _same(tp, packed, f"packed at {t} threads")
        _same(twin.qsgd_decode_fixed(norms, packed, n, s, d, dtype, 1.0), want, f"decode at {t} threads")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n", [0, 1, 7, 33, 8001, 140_001])
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: f"s{o[0]}-d{o[1]}-{'max' if o[2] else 'l2'}")
def test_elias_twin_equals_cpu(twin, threads, opt, n, dtype):
    C = require_native()
    s, d, max_norm = opt
    gb = group_buckets(d)
    g = _grad(n, dtype, seed=2 * n + s)
    norms, nbits, stream = C.qsgd_encode_elias(g, s, d, max_norm, KEY, gb)
    want = C.qsgd_decode_elias(norms, nbits, stream, n, s, d, gb, dtype)
    for t in THREADS:
        threads(t)
        tn, tb, ts = twin.qsgd_encode_elias(g, s, d, max_norm, KEY, gb)
        _same(tn, norms, f"norms at {t} threads")
        _same(tb, nbits, f"nbits at {t} threads")
        _same(ts, stream, f"stream at {t} threads")
        _same(twin.qsgd_decode_elias(norms, nbits, stream, n, s, d, gb, dtype), want, f"decode at {t} threads")


@pytest.mark.parametrize("gb", [1, 3, 64, 10_000])
@pytest.mark.parametrize("d", [1, 2, 5])
def test_elias_buckets_sharing_bytes(twin, d, gb):
    """Buckets of 1..5 values code in 1 to ~20 bits: many buckets start and end inside one byte
    (up to 8 in a byte); groups of various sizes put the byte alignment in different places."""
    C = require_native()
    for seed, density in ((0, 0.0), (1, 0.1), (2, 0.5), (3, 1.0)):
        gen = torch.Generator().manual_seed(seed)
        g = torch.randn(5000, generator=gen) * (torch.rand(5000, generator=gen) < density)
        for s in (1, 3, 255):
            want = C.qsgd_encode_elias(g, s, d, False, seed, gb)
            got = twin.qsgd_encode_elias(g, s, d, False, seed, gb)
            for name, a, b in zip(("norms", "nbits", "stream"), got, want):
                _same(a, b, f"{name} (d={d}, gb={gb}, s={s}, density={density})")
            dec = C.qsgd_decode_elias(*want, 5000, s, d, gb, torch.float32)
            _same(twin.qsgd_decode_elias(*want, 5000, s, d, gb, torch.float32), dec, "decode")


@pytest.mark.parametrize("K", range(1, 9))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("opt", [(15, 512, False), (255, 100, True), (5, 33, False), (1000, 64, False)],
                         ids=lambda o: f"s{o[0]}-d{o[1]}-{'max' if o[2] else 'l2'}")
def test_fixed_decode_sum_of_k_payloads(twin, threads, opt, dtype, K):
    C = require_native()
    s, d, max_norm = opt
    n = 3001
    enc = [C.qsgd_encode_fixed(_grad(n, dtype, seed=10 + k), s, d, max_norm, KEY + k) for k in range(K)]
    # strided rows of one receive buffer, as the exchange hands them over
    nb, pb = enc[0][0].numel(), enc[0][1].numel()
    norms = torch.zeros(K, nb + 3)[:, 1:nb + 1]
    packed = torch.zeros(K, pb + 5, dtype=torch.uint8)[:, 2:pb + 2]
    for k, (nr, pk) in enumerate(enc):
        norms[k], packed[k] = nr, pk
    want = C.qsgd_decode_fixed(norms, packed, n, s, d, dtype, 1.0 / K)
    for t in THREADS:
        threads(t)
        _same(twin.qsgd_decode_fixed(norms, packed, n, s, d, dtype, 1.0 / K), want, f"K={K} at {t} threads")


def _elias_payload(C, n=4000, s=7, d=16, gb=1):
    g = _grad(n, torch.float32, seed=9)
    return C.qsgd_encode_elias(g, s, d, False, 3, gb), (n, s, d, gb)


def test_elias_malformed_streams_refused_like_cpu(twin):
    C = require_native()
    (norms, nbits, stream), (n, s, d, gb) = _elias_payload(C)
    gen = torch.Generator().manual_seed(1)
    cases = [("zeroed", norms, nbits, torch.zeros_like(stream)),
             ("ones", norms, nbits, torch.full_like(stream, 255)),
             ("random", norms, nbits, torch.randint(0, 256, stream.shape, generator=gen, dtype=torch.uint8))]
    flipped = stream.clone()
    for pos in range(0, stream.numel(), 37):
        f = flipped.clone()
        f[pos] ^= 0x10
        cases.append((f"bit flip at {pos}", norms, nbits, f))
    shifted = nbits.clone()
    shifted[0] += 8
    shifted[1] -= 8
    cases.append(("counts shifted", norms, shifted, stream))
    neg = nbits.clone()
    neg[2] = -1
    cases.append(("negative count", norms, neg, stream))
    refused = 0
    for name, nr, nb, st in cases:
        want = outcome(C.qsgd_decode_elias, nr, nb, st, n, s, d, gb, torch.float32)
        got = outcome(twin.qsgd_decode_elias, nr, nb, st, n, s, d, gb, torch.float32)
        assert got == want, f"{name}: twin {got} vs CPU {want}"
        refused += want[0] is not None
        if want[0] is None:  # accepted by both: the same values
            _same(twin.qsgd_decode_elias(nr, nb, st, n, s, d, gb, torch.float32),
                  C.qsgd_decode_elias(nr, nb, st, n, s, d, gb, torch.float32), name)
    assert refused >= 5


@pytest.mark.parametrize("n", [100, 8001, (1 << 20) + 3])
def test_algorithm_calls_per_op_do_not_grow_with_size(twin, n):
    g = _grad(n, torch.float32, seed=1)
    gb = group_buckets(512)
    norms, packed = twin.qsgd_encode_fixed(g, 15, 512, False, KEY)
    assert device_calls(twin, lambda: twin.qsgd_encode_fixed(g, 15, 512, False, KEY)) == 3
    stacked_n, stacked_p = norms.expand(3, -1), packed.expand(3, -1)
    assert device_calls(twin, lambda: twin.qsgd_decode_fixed(stacked_n, stacked_p, n, 15, 512, torch.float32, 1 / 3)) == 1
    enc = twin.qsgd_encode_elias(g, 15, 512, False, KEY, gb)
    assert device_calls(twin, lambda: twin.qsgd_encode_elias(g, 15, 512, False, KEY, gb)) == 9
    assert device_calls(twin, lambda: twin.qsgd_decode_elias(*enc, n, 15, 512, gb, torch.float32)) == 3
