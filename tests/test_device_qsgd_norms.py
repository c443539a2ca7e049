"""QSGD's bucket norms on the OpenMP twin (csrc/device/qsgd_functors.h: LaneNorm, the 8 lanes of
every bucket in parallel, then FinishNorm's fixed combine) bitwise against the CPU kernel's
serial bucket_norm, on the values where the order shows: NaNs (with payloads, signed, in
several lanes of one bucket: the first one by position wins, not the first lane's), infinities,
values whose squares overflow or underflow, and buckets shorter than the 8 lanes. Single-tensor
ops and bucket ops, fixed and Elias coding, l2 and max norms, every dtype.

A NaN norm's payload bits are compared where the CPU kernel and the device code agree on them
before any lane split (max norms of bfloat16, float32 and float64: the first NaN by position, as
read; l2 norms of float64). Elsewhere they differ already in the serial device code, for reasons
outside the summation order: float16 values reach float through c10's conversion on the CPU and
half_bits.h's on the device, which set NaN payloads differently, and which NaN of a sum of two
NaNs survives is the compiler's choice of operand order. There only NaN-ness is compared (every
other norm, and all codes, bitwise).
"""
from __future__ import annotations

import pytest
import torch

from horovod_gradcomp.native import require_native, require_twin

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# NaN bit patterns of each dtype (a signalling one, a quiet one with a payload, a negative one),
# as the integer type of the same width
NANS = {
    torch.float16: (torch.int16, [0x7C01, 0x7E05, -0x0187]),  # -0x0187: 0xFE79
    torch.bfloat16: (torch.int16, [0x7F81, 0x7FC3, -0x003D]),  # 0xFFC3
    torch.float32: (torch.int32, [0x7F800001, 0x7FC00005, -0x003FFFF7]),  # 0xFFC00009
    torch.float64: (torch.int64, [0x7FF0000000000001, 0x7FF8000000000005, -0x0007FFFFFFFFFFF3]),
}
KEY = 77
D = 37  # bucket size: not a multiple of the 8 lanes


def _nan(dtype, which):
    itype, bits = NANS[dtype]
    return torch.tensor([bits[which]], dtype=itype).view(dtype)[0]


def _values(dtype, n=6 * D + 5, seed=0):
    """Buckets of D values (the last one 5): 0 two NaNs in lanes 2 and 5, the later-lane one
    first by position; 1 two NaNs in one lane; 2 +-inf; 3 a negative NaN after an inf; 4 huge
    and tiny values (squares beyond and below the dtype's range); 5 zeros; 6 (5 values) one NaN."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=gen, dtype=torch.float64) * 0.5).to(dtype)
    x[13] = _nan(dtype, 0)  # lane 5, position 13: the first NaN of bucket 0
    x[18] = _nan(dtype, 1)  # lane 2, position 18
    x[D + 3] = _nan(dtype, 1)  # bucket 1, lane 3
    x[D + 11] = _nan(dtype, 0)  # bucket 1, lane 3 again, later
    x[2 * D + 4] = float("inf")
    x[2 * D + 9] = -float("inf")
    x[3 * D + 1] = float("inf")
    x[3 * D + 30] = _nan(dtype, 2)
    big = torch.finfo(dtype).max
    x[4 * D: 4 * D + 8] = torch.tensor([big, -big, big / 3, 1e-30, -1e-30, 3e-39, 0.0, -0.0], dtype=torch.float64).to(dtype)
    x[5 * D: 6 * D] = 0.0
    x[6 * D + 4] = _nan(dtype, 1)
    return x


def _same_norms(a, b, what, payloads):
    """Norms bitwise; with payloads False, a NaN only as NaN."""
    if payloads:
        return _same(a, b, what)
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN at {a.isnan().nonzero().tolist()} vs {b.isnan().nonzero().tolist()}"
    _same(a[~a.isnan()], b[~b.isnan()], what)


def _payloads(dtype, max_norm):
    """Whether NaN norms' payloads agree between the CPU kernel and the device code (module doc)."""
    return (max_norm and dtype != torch.float16) or dtype == torch.float64


def _same(a, b, what):
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()
    assert a.dtype == b.dtype and a.numel() == b.numel(), f"{what}: {a.dtype}[{a.numel()}] vs {b.dtype}[{b.numel()}]"
    if not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
        bad = [i for i in range(a.numel()) if not torch.equal(a[i:i + 1].view(torch.uint8), b[i:i + 1].view(torch.uint8))]
        raise AssertionError(f"{what}: elements {bad} differ: {a[bad].tolist()} vs {b[bad].tolist()}")


@pytest.mark.parametrize("max_norm", [False, True], ids=["l2", "max"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_norms_with_nonfinite_values_are_the_cpu_kernels(dtype, max_norm):
    cpu, twin = require_native(), require_twin()
    x = _values(dtype)
    payloads = _payloads(dtype, max_norm)
    want_n, want_p = cpu.qsgd_encode_fixed(x, 15, D, max_norm, KEY)
    if max_norm and dtype == torch.float32:  # the premise: bucket 0's norm is its first NaN by position
        assert want_n[:2].view(torch.int32).tolist() == [0x7F800001, 0x7FC00005], want_n[:2].view(torch.int32)
    for name, (got_n, got_p) in {
        "fixed": twin.qsgd_encode_fixed(x, 15, D, max_norm, KEY),
        "fixed bucket": [t[1] for t in twin.qsgd_encode_fixed_many([x[:40], x], 15, D, max_norm, [KEY + 1, KEY])],
    }.items():
        _same_norms(got_n, want_n, f"{name} norms", payloads)
        _same(got_p, want_p, f"{name} codes")
    gb = 2
    want = cpu.qsgd_encode_elias(x, 15, D, max_norm, KEY, gb)
    single = twin.qsgd_encode_elias(x, 15, D, max_norm, KEY, gb)
    many = twin.qsgd_encode_elias_many([x[:40], x], 15, D, max_norm, [KEY + 1, KEY], gb)
    _same_norms(single[0], want[0], "Elias norms", payloads)
    _same_norms(many[0][1], want[0], "Elias bucket norms", payloads)
    for j, name in ((1, "nbits"), (2, "stream")):
        _same(single[j], want[j], f"Elias {name}")
        _same(many[j][1], want[j], f"Elias bucket {name}")


@pytest.mark.parametrize("d", [1, 3, 8, 9, 16])
def test_buckets_shorter_than_the_lanes(d):
    """Buckets of 1 to 16 values (lanes past a bucket's end hold nothing), with two NaNs and an inf."""
    cpu, twin = require_native(), require_twin()
    for dtype in (torch.float32, torch.float16):
        x = (torch.randn(53, generator=torch.Generator().manual_seed(d)) * 0.5).to(dtype)
        x[20], x[25], x[30] = _nan(dtype, 1), _nan(dtype, 0), float("inf")
        for max_norm in (False, True):
            want = cpu.qsgd_encode_fixed(x, 7, d, max_norm, KEY)
            got = twin.qsgd_encode_fixed(x, 7, d, max_norm, KEY)
            _same_norms(got[0], want[0], f"norms d={d} {dtype} max={max_norm}", _payloads(dtype, max_norm))
            _same(got[1], want[1], f"codes d={d} {dtype} max={max_norm}")
