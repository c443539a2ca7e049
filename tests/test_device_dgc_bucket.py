"""DGC's bucket ops on the OpenMP twin (csrc/device/dgc_device.cu's *_many launchers over
csrc/device/multi_tensor.cuh): ``dgc_scatter_sum_many`` / ``dgc_decode_sum_many`` (the decode-mean
of a bucket, K variable-size payloads per tensor), ``dgc_accumulate_many_`` (momentum correction),
``dgc_mask_many_`` (the sent entries' masking), ``dgc_select_many`` (the selection, each tensor with
its own k, sample count and key) and ``dgc_index_encode_many`` (the index code), bitwise against
the per-tensor ops (the selection against the CPU kernel, the oracle); the number
of device algorithm calls of each, which must not grow with the bucket's tensor count; their
refusals; and the codec, the memory and a one-rank exchange through them (impl="twin" against
impl="native").
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs import dgc as dgc_mod
from horovod_gradcomp.native import require_native
from horovod_gradcomp.state.dgc_memory import DensitySchedule, DGCMemory

from device_helpers import D, device_calls  # noqa: F401 (fixtures)
from one_rank import OneRank

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# The sizes, plus one whose payloads need absolute index codes (gaps above 65536).
SIZES = [0, 1, 7, 31, 32, 33, 8 * 1024 + 1, 200_001]


@pytest.fixture(scope="module")
def C():
    return require_native()


@pytest.fixture(params=[1, 2], ids=lambda t: f"threads{t}")
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)), \
        f"{what}: bytes differ"


def _payload(C, n: int, dtype: torch.dtype, seed: int):
    """(indices, values) of one rank's selection of about n / 8 values of a random tensor (empty for
    n == 0); the 200_001-value tensor gets three far-apart indices (an absolute index code)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=gen, dtype=torch.float64) * 3).to(dtype)
    if n == 200_001:
        idx = torch.tensor([seed % 7, 100_000 + seed, 200_000], dtype=torch.int32)
        return idx, x[idx.long()].clone()
    if n == 0:
        return torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=dtype)
    idx, vals, _, _ = C.dgc_select(x, max(1, n // 8), 0, seed)
    return idx, vals


def _bucket(C, sizes, dtypes, K, seed=0):
    """Per tensor: its n, dtype and K payloads (indices, values)."""
    return [(n, dt, [_payload(C, n, dt, seed + 97 * t + r) for r in range(K)])
            for t, (n, dt) in enumerate(zip(sizes, dtypes))]


def _codes(C, bucket):
    """Each payload's index code, at an odd offset of one receive buffer (as an allgatherv
    delivers them)."""
    flat = [C.dgc_index_encode(idx, n) for n, _, pays in bucket for idx, _ in pays]
    buf = torch.cat([torch.zeros(1, dtype=torch.uint8)] + flat)
    views, at = [], 1
    for c in flat:
        views.append(buf[at:at + c.numel()])
        at += c.numel()
    K = len(bucket[0][2])
    return [views[t * K:(t + 1) * K] for t in range(len(bucket))]


def _per_tensor(D, bucket, scale):
    return [D.dgc_scatter_sum([p[0] for p in pays], [p[1] for p in pays], n, dt, scale) for n, dt, pays in bucket]


def _mixed(count):
    return [SIZES[t % len(SIZES)] for t in range(count)], [DTYPES[(t // 3) % 4] for t in range(count)]


# ---- decode-sum ---------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [1, 3])
def test_scatter_and_decode_sum_many_equal_per_tensor(C, D, threads, K):
    sizes, dtypes = _mixed(2 * len(SIZES))
    bucket = _bucket(C, sizes, dtypes, K, seed=K)
    scale = 1.0 / K
    want = _per_tensor(D, bucket, scale)
    for t, (n, dt, pays) in enumerate(bucket):  # the twin's per-tensor op is the CPU's, bitwise
        _same(want[t], C.dgc_scatter_sum([p[0] for p in pays], [p[1] for p in pays], n, dt, scale), f"cpu {t}")
    args = ([n for n, _, _ in bucket], [dt for _, dt, _ in bucket], scale)
    got = D.dgc_scatter_sum_many([[p[0] for p in pays] for _, _, pays in bucket],
                                 [[p[1] for p in pays] for _, _, pays in bucket], *args, [None] * len(bucket))
    codes = _codes(C, bucket)
    outs = [torch.full((n,), 7.0, dtype=dt) for n, dt, _ in bucket]
    decoded = D.dgc_decode_sum_many(codes, [[p[1] for p in pays] for _, _, pays in bucket], *args, outs)
    for t, (n, dt, _) in enumerate(bucket):
        _same(got[t], want[t], f"scatter tensor {t} (n={n}, {dt})")
        assert decoded[t].data_ptr() == outs[t].data_ptr()
        _same(outs[t], want[t], f"decode tensor {t} (n={n}, {dt})")


def test_decode_sum_many_reads_every_code_width(C, D):
    """1-byte gaps, 2-byte gaps, absolute int32 indices, empty payloads, in one bucket."""
    n = 300_000
    idx_sets = [torch.arange(0, 2000, 3), torch.arange(5, n, 300), torch.tensor([0, 70_000, n - 1]), torch.zeros(0)]
    pays = [(i.to(torch.int32), torch.randn(i.numel())) for i in idx_sets]
    widths = {C.dgc_index_encode(i, n).numel() // max(1, i.numel()) for i, _ in pays}
    assert widths == {1, 2, 4, 0}, widths
    bucket = [(n, torch.float32, pays), (n, torch.float32, pays[::-1])]
    want = _per_tensor(D, bucket, 0.25)
    got = D.dgc_decode_sum_many(_codes(C, bucket), [[p[1] for p in ps] for _, _, ps in bucket], [n, n],
                                [torch.float32] * 2, 0.25, [None, None])
    for t in range(2):
        _same(got[t], want[t], f"tensor {t}")


def _valid(idx, n):
    return bool((idx >= 0).all()) and bool((idx < n).all()) and bool((idx[1:] > idx[:-1]).all())


def test_sum_many_refusals(C, D):
    f32, i32, u8 = torch.float32, torch.int32, torch.uint8
    good = (torch.tensor([1, 4, 9], dtype=i32), torch.ones(3))
    bad_order = (torch.tensor([4, 2], dtype=i32), torch.ones(2))
    out_of_range = (torch.tensor([2, 50], dtype=i32), torch.ones(2))

    def call(pays_per_tensor, n=(50, 50), dtypes=(f32, f32), outs=None, op="dgc_scatter_sum_many"):
        idx = [[p[0] for p in ps] for ps in pays_per_tensor]
        vals = [[p[1] for p in ps] for ps in pays_per_tensor]
        if op == "dgc_decode_sum_many":
            # gap codes for the valid indices, the bad ones as they are (an absolute code)
            idx = [[C.dgc_index_encode(i, nn) if _valid(i, nn) else i.view(u8) for i in ii] for ii, nn in zip(idx, n)]
        return getattr(D, op)(idx, vals, list(n), list(dtypes), 1.0, outs or [None] * len(idx))

    for op in ("dgc_scatter_sum_many", "dgc_decode_sum_many"):
        for bad, words in ((bad_order, "tensor 1, payload 1: indices must be strictly increasing"),
                           (out_of_range, "tensor 1, payload 1: indices must be strictly increasing and in [0, 50)")):
            out = torch.full((50,), 3.0)
            with pytest.raises(RuntimeError, match=re.escape(words)):
                call([[good, good], [good, bad]], outs=[None, out], op=op)
            assert bool((out == 3.0).all()), "a refused bucket writes nothing"
        with pytest.raises(RuntimeError, match="tensor 1 has 1 index and 1 value buffers, tensor 0 has 2 payloads"):
            call([[good, good], [good]], op=op)
        with pytest.raises(RuntimeError, match="one entry per tensor"):
            call([[good], [good]], n=(50,), op=op)
        first = good[0] if op == "dgc_scatter_sum_many" else C.dgc_index_encode(good[0], 50)
        with pytest.raises(RuntimeError, match="a bucket is on one device"):
            getattr(D, op)([[first], [first.to("meta")]], [[good[1]], [good[1].to("meta")]], [50, 50], [f32, f32],
                           1.0, [None, None])
    with pytest.raises(RuntimeError, match="values must be"):
        call([[good], [(good[0], torch.ones(3, dtype=torch.float64))]])
    with pytest.raises(RuntimeError, match="bytes of index code"):
        D.dgc_decode_sum_many([[torch.zeros(5, dtype=u8)]], [[torch.ones(3)]], [50], [f32], 1.0, [None])
    assert D.dgc_scatter_sum_many([], [], [], [], 1.0, []) == []


# ---- momentum correction and masking ------------------------------------------------------------

@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("coef", [1.0, 0.37])
def test_accumulate_many_equals_per_tensor(C, D, threads, nesterov, coef):
    sizes = SIZES[:-1] * 2
    dtypes = [torch.float32 if t % 3 else torch.float64 for t in range(len(sizes))]
    gen = torch.Generator().manual_seed(3)
    gs = [torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n, dt in zip(sizes, dtypes)]
    us = [torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n, dt in zip(sizes, dtypes)]
    vs = [torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n, dt in zip(sizes, dtypes)]
    uw, vw = [u.clone() for u in us], [v.clone() for v in vs]
    for u, v, g in zip(uw, vw, gs):
        D.dgc_accumulate_(u, v, g, 0.9, nesterov, coef)
    D.dgc_accumulate_many_(us, vs, gs, 0.9, nesterov, coef)
    for t in range(len(gs)):
        _same(us[t], uw[t], f"u {t}")
        _same(vs[t], vw[t], f"v {t}")


@pytest.mark.parametrize("with_u", [False, True], ids=["v", "u_and_v"])
def test_mask_many_equals_index_fill(C, D, with_u):
    sizes, dtypes = _mixed(2 * len(SIZES))
    gen = torch.Generator().manual_seed(4)
    vs = [torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n, dt in zip(sizes, dtypes)]
    us = [torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n, dt in zip(sizes, dtypes)]
    sent = [_payload(C, n, dt, t)[0] for t, (n, dt) in enumerate(zip(sizes, dtypes))]
    vw, uw = [v.clone() for v in vs], [u.clone() for u in us]
    for i, s in enumerate(sent):
        vw[i].index_fill_(0, s.long(), 0)
        if with_u:
            uw[i].index_fill_(0, s.long(), 0)
    D.dgc_mask_many_(sent, vs, us if with_u else None)
    for t in range(len(vs)):
        _same(vs[t], vw[t], f"v {t}")
        _same(us[t], uw[t], f"u {t}")


def test_accumulate_and_mask_many_refusals(D):
    f32 = torch.float32
    u, v, g = torch.zeros(5), torch.zeros(5), torch.ones(5)
    with pytest.raises(RuntimeError, match="one entry per tensor"):
        D.dgc_accumulate_many_([u], [v, v], [g], 0.9, False)
    with pytest.raises(RuntimeError, match="a bucket is on one device"):
        D.dgc_accumulate_many_([u, u], [v, v], [g, g.to("meta")], 0.9, False)
    with pytest.raises(RuntimeError, match="fp32 or fp64"):
        D.dgc_accumulate_many_([u.half()], [v.half()], [g.half()], 0.9, False)
    with pytest.raises(RuntimeError, match="momentum must be in"):
        D.dgc_accumulate_many_([u], [v], [g], 1.5, False)
    idx = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="one entry per tensor"):
        D.dgc_mask_many_([idx, idx], [v])
    with pytest.raises(RuntimeError, match="indices 0 must be contiguous 1-D Int"):
        D.dgc_mask_many_([idx.long()], [v])
    with pytest.raises(RuntimeError, match="u 0 must be a contiguous Float tensor of 5 values"):
        D.dgc_mask_many_([idx], [v], [torch.zeros(4, dtype=f32)])


# ---- the number of device calls per bucket -------------------------------------------------------

def _bucket_calls(C, D, count, dtypes, K=3):
    """The device calls of each bucket op on a bucket of `count` tensors of 1000 values."""
    sizes = [1000] * count
    bucket = _bucket(C, sizes, dtypes, K, seed=count)
    idx = [[p[0] for p in pays] for _, _, pays in bucket]
    vals = [[p[1] for p in pays] for _, _, pays in bucket]
    args = (sizes, dtypes, 1.0 / K, [None] * count)
    codes = _codes(C, bucket)
    wide = [dt in (torch.float32, torch.float64) for dt in dtypes]
    acc = [torch.randn(1000, dtype=dt) for dt, w in zip(dtypes, wide) if w]
    u, v = [a.clone() for a in acc], [a.clone() for a in acc]
    masks = [torch.zeros(1000, dtype=dt) for dt in dtypes]
    return {
        "scatter_sum_many": device_calls(D, lambda: D.dgc_scatter_sum_many(idx, vals, *args)),
        "decode_sum_many": device_calls(D, lambda: D.dgc_decode_sum_many(codes, vals, *args)),
        "accumulate_many": device_calls(D, lambda: D.dgc_accumulate_many_(u, v, acc, 0.9, True, 0.5)),
        "mask_many": device_calls(D, lambda: D.dgc_mask_many_([i[0] for i in idx], masks, masks)),
    }


def test_device_calls_per_bucket_do_not_grow_with_its_tensor_count(C, D):
    """K = 3 payloads per tensor. One dtype: decode-sum 5 (indices and their check) + 3 + 2;
    momentum correction 1; masking 1. Four dtypes: 5 + 4 * (3 + 2); momentum correction 2 (fp32,
    fp64). Per-tensor ops would cost (decode 3 per payload + 7) * tensors."""
    for dt in (torch.float32, torch.float16):
        counts = {c: _bucket_calls(C, D, c, [dt] * c) for c in (1, 3, 40)}
        want = {"scatter_sum_many": 10, "decode_sum_many": 10, "accumulate_many": int(dt == torch.float32),
                "mask_many": 1}
        assert counts[1] == counts[3] == counts[40] == want, (dt, counts)
    mixed = {c: _bucket_calls(C, D, c, [DTYPES[t % 4] for t in range(c)]) for c in (4, 40)}
    assert mixed[4] == mixed[40] == {"scatter_sum_many": 25, "decode_sum_many": 25, "accumulate_many": 2,
                                     "mask_many": 1}, mixed


# ---- selection and index coding -------------------------------------------------------------------

SELECT_SIZES = [0, 1, 7, 31, 32, 33, 8 * 1024 + 1, (1 << 20) + 3]


def _select_case(n: int, dtype: torch.dtype, kind: str, seed: int) -> torch.Tensor:
    """A tensor of n values: "randn" (some infs and a NaN when large enough), "ties" (half the
    values 2, half 1: a sampled estimate counts far more than 2k, path 1), "sparse" (a few
    nonzeros: the samples see zeros, the estimate counts less than k/2, path 2)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "ties":
        return (1.0 + (torch.arange(n) % 2).double() * torch.sign(torch.randn(n, generator=gen, dtype=torch.float64))
                ).abs().add(0.0).mul(torch.sign(torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
    if kind == "sparse":
        x = torch.zeros(n, dtype=torch.float64)
        nz = torch.randperm(n, generator=gen)[:max(1, n // 8000)]
        x[nz] = torch.randn(nz.numel(), generator=gen, dtype=torch.float64)
        return x.to(dtype)
    x = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    if n >= 64:
        x[5], x[17], x[40] = math.inf, -math.inf, math.nan
    return x.to(dtype)


def _select_bucket(densities=(0.001, 0.02, 0.3, 1.0), kinds=("randn", "ties", "sparse"), sizes=SELECT_SIZES):
    xs, ks, ms, keys = [], [], [], []
    for n in sizes:
        for t, dt in enumerate(DTYPES):
            for kind in kinds:
                for density in densities:
                    xs.append(_select_case(n, dt, kind, seed=len(xs)))
                    ks.append(dgc_mod.target_count(n, density))
                    ms.append(dgc_mod.sample_count(n, density, 0.01))
                    keys.append((len(xs) * 0x9E3779B1 + 12345) % (1 << 62) - (1 << 61))
    return xs, ks, ms, keys


def test_select_many_equals_per_tensor_cpu(C, D, threads):
    """dgc_select_many on the twin: bitwise the CPU kernel's indices, values, threshold and path of
    every tensor (and the twin's per-tensor op's), for the issue's sizes, every dtype, and data that
    takes each path (0: estimate accepted, 1: refined among the candidates, 2: exact)."""
    xs, ks, ms, keys = _select_bucket()
    idx, vals, ts, paths = D.dgc_select_many(xs, ks, ms, keys)
    assert len(idx) == len(vals) == len(ts) == len(paths) == len(xs)
    seen = set()
    for t, x in enumerate(xs):
        what = f"tensor {t} (n={x.numel()}, {x.dtype}, k={ks[t]}, m={ms[t]})"
        for oracle in (C, D):
            wi, wv, wt, wp = oracle.dgc_select(x, ks[t], ms[t], keys[t])
            _same(idx[t], wi, f"{what} indices")
            _same(vals[t], wv, f"{what} values")
            assert (ts[t] == wt or (math.isnan(ts[t]) and math.isnan(wt))) and paths[t] == wp, \
                (what, ts[t], wt, paths[t], wp)
        seen.add(paths[t])
        if ms[t] > 0:
            seen.add(("sampled", paths[t]))
    assert {("sampled", 0), ("sampled", 1), ("sampled", 2), 2} <= seen, seen


def test_select_many_wide_and_odd_inputs(C, D):
    """A lone tensor, k == 0 (nothing selected, threshold inf, path 2), an all-zero tensor, k >= n,
    and an explicit sample count larger than n: the per-tensor results."""
    xs = [torch.randn(100), torch.zeros(50), torch.randn(10, dtype=torch.float64), torch.randn(5000).half()]
    ks, ms, keys = [0, 3, 10, 20], [0, 0, 0, 9000], [1, 2, 3, -4]
    for sub in ([0], [1], [2], [3], [0, 1, 2, 3]):
        got = D.dgc_select_many([xs[i] for i in sub], [ks[i] for i in sub], [ms[i] for i in sub],
                                [keys[i] for i in sub])
        for j, i in enumerate(sub):
            wi, wv, wt, wp = C.dgc_select(xs[i], ks[i], ms[i], keys[i])
            _same(got[0][j], wi, f"{i} indices")
            _same(got[1][j], wv, f"{i} values")
            assert (got[2][j], got[3][j]) == (wt, wp), (i, got[2][j], wt, got[3][j], wp)
    assert D.dgc_select_many([], [], [], []) == ([], [], [], [])


def test_index_encode_many_equals_per_tensor(C, D):
    """Every code width (1- and 2-byte gaps, absolute int32 indices) and empty index lists."""
    n = 300_000
    sets = [torch.arange(0, 2000, 3), torch.arange(5, n, 300), torch.tensor([0, 70_000, n - 1]), torch.zeros(0),
            torch.tensor([n - 1])]
    idx = [s.to(torch.int32) for s in sets] + [torch.arange(0, 20, 2, dtype=torch.int32)[::2]]  # a strided one
    ns = [n] * len(sets) + [20]
    codes = D.dgc_index_encode_many(idx, ns)
    widths = set()
    for t, (i, nn) in enumerate(zip(idx, ns)):
        _same(codes[t], C.dgc_index_encode(i.contiguous(), nn), f"code {t}")
        _same(codes[t], D.dgc_index_encode(i.contiguous(), nn), f"twin code {t}")
        widths.add(codes[t].numel() // max(1, i.numel()))
    assert widths == {1, 2, 4, 0}, widths
    assert D.dgc_index_encode_many([], []) == []


def test_select_and_encode_many_refusals(D):
    x = torch.randn(10)
    with pytest.raises(RuntimeError, match="must have one entry per tensor"):
        D.dgc_select_many([x, x], [1], [0, 0], [0, 0])
    with pytest.raises(RuntimeError, match="x 1 must be contiguous"):
        D.dgc_select_many([x, torch.randn(10, 2)[:, 0]], [1, 1], [0, 0], [0, 0])
    with pytest.raises(RuntimeError, match="x 1 must be fp16, bf16, fp32 or fp64, got Int"):
        D.dgc_select_many([x, torch.ones(3, dtype=torch.int32)], [1, 1], [0, 0], [0, 0])
    with pytest.raises(RuntimeError, match="tensor 1: k and sample_count must be >= 0"):
        D.dgc_select_many([x, x], [1, -1], [0, 0], [0, 0])
    with pytest.raises(RuntimeError, match="a bucket is on one device"):
        D.dgc_select_many([x, x.to("meta")], [1, 1], [0, 0], [0, 0])
    i32 = torch.tensor([1, 4, 9], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="must have one entry per tensor"):
        D.dgc_index_encode_many([i32], [10, 10])
    with pytest.raises(RuntimeError, match=re.escape("tensor 1: indices must be strictly increasing and in [0, 10)")):
        D.dgc_index_encode_many([i32, i32.flip(0)], [10, 10])
    with pytest.raises(RuntimeError, match=re.escape("tensor 0: indices must be strictly increasing and in [0, 5)")):
        D.dgc_index_encode_many([i32], [5])
    with pytest.raises(RuntimeError, match="indices must be 1-D Int"):
        D.dgc_index_encode_many([i32, i32.long()], [10, 10])
    with pytest.raises(RuntimeError, match="a bucket is on one device"):
        D.dgc_index_encode_many([i32, i32.to("meta")], [10, 10])


def _select_calls(D, xs, density):
    ns = [x.numel() for x in xs]
    args = ([dgc_mod.target_count(n, density) for n in ns], [dgc_mod.sample_count(n, density, 0.01) for n in ns],
            [1000 + t for t in range(len(xs))])
    out = []
    calls = device_calls(D, lambda: out.append(D.dgc_select_many(xs, *args)))
    enc = device_calls(D, lambda: D.dgc_index_encode_many(out[0][0], ns))
    return calls, enc, sorted(set(out[0][3]))


def _radix_passes(xs, density):
    """The radix passes of a bucket's selection: the widest sampled tensor's key bytes (0 when none
    is sampled)."""
    return max([x.element_size() for x in xs if dgc_mod.sample_count(x.numel(), density, 0.01) > 0], default=0)


def test_select_many_device_calls_do_not_grow_with_its_tensor_count(D):
    """Selection: gather + segmented sort + per-tensor count (a scan by tensor) + the decision of
    every tensor's path, then the places of the selected (a scan) + write: 6 calls without a
    sampled tensor; with one, the refinement runs on the device whatever the estimates (a radix
    select: 3 calls per byte of the widest sampled key, tile histograms, their sums, the digit),
    6 + 3 * bytes, the same on the sampled, refined and mixed paths; one read-back. Index coding:
    3 (a scan by tensor and a gather, one read-back, the write). Per-tensor ops: 4 to 7 calls and
    1 or 2 read-backs per tensor for the selection, 2 calls and a read-back per tensor for the
    code."""
    cases = {"exact": ("randn", 1000, 0.01, [2]), "sampled": ("randn", 40_000, 0.01, [0]),
             "refined": ("ties", 40_000, 0.01, [1]), "mixed": (None, None, 0.01, [0, 1, 2])}
    for name, (kind, n, density, want_paths) in cases.items():
        for count in (1, 3, 40):
            if kind is None:  # every path in one bucket (3 tensors at least)
                pattern = [("randn", 40_000), ("ties", 40_000), ("randn", 1000), ("sparse", 40_000)]
                xs = [_select_case(pattern[t % 4][1], DTYPES[t % 4], pattern[t % 4][0], t)
                      for t in range(max(count, 4))]
            else:
                xs = [_select_case(n, DTYPES[t % 4], kind, t) for t in range(count)]
            passes = _radix_passes(xs, density)
            assert passes == (0 if name == "exact" else {1: 2, 3: 4, 40: 8}[count] if name != "mixed" else 8)
            calls, enc, paths = _select_calls(D, xs, density)
            assert (calls, enc) == (6 + 3 * passes, 3) and paths == want_paths, (name, count, calls, enc, paths)


def _sample_places(key: int, m: int, n: int) -> list[int]:
    """The places of a selection's m samples (csrc/splitmix64.h's dgc_sample_place), computed here."""
    from horovod_gradcomp.codecs.streams import mix64
    golden, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1
    return [(mix64((key + (j + 1) * golden) & mask) * n) >> 64 for j in range(m)]


def test_select_many_radix_edges_equal_per_tensor(C, D):
    """The device refinement's exact rule at its edges, each tensor against the CPU's dgc_select,
    every one refined (paths 1 and 2): nonzero keys exactly k, k - 1, k + 1 (t = 1 unless more than
    k are nonzero; a few large values at sampled places push the estimate's count under k/2), all
    zero, every key equal, ties at the k-th largest, infs and NaNs above it, in every dtype (2, 4,
    8 key bytes in one bucket)."""
    n, k, m = 40_000, 400, 400
    gen = torch.Generator().manual_seed(11)
    xs, keys = [], []

    def add(x, key):
        for dt in DTYPES:
            xs.append(x.to(dt))
            keys.append(key)

    for j, nnz in enumerate((k, k - 1, k + 1)):
        key = 100 + j
        sampled = sorted(set(_sample_places(key, m, n)))
        x = torch.zeros(n, dtype=torch.float64)
        big = torch.tensor(sampled[:10])  # 10 sampled places >= the 4th largest sample: c0 = 10 < k / 2
        x[big] = 100.0 + torch.rand(10, generator=gen, dtype=torch.float64)
        rest = torch.tensor([i for i in torch.randperm(n, generator=gen).tolist() if i not in set(sampled)][:nnz - 10])
        x[rest] = 0.5 + torch.rand(nnz - 10, generator=gen, dtype=torch.float64)
        add(x, key)
    ties = torch.full((n,), 0.5, dtype=torch.float64)
    ties[torch.randperm(n, generator=gen)[:k // 2]] = 2.0  # the k-th largest among many equal keys
    special = torch.ones(n, dtype=torch.float64)
    special[:3] = torch.tensor([math.inf, -math.inf, math.nan])
    for j, x in enumerate([torch.zeros(n, dtype=torch.float64), torch.full((n,), -3.0, dtype=torch.float64), ties,
                           special]):
        add(x, 200 + j)
    got = D.dgc_select_many(xs, [k] * len(xs), [m] * len(xs), keys)
    for j, x in enumerate(xs):
        wi, wv, wt, wp = C.dgc_select(x, k, m, keys[j])
        _same(got[0][j], wi, f"{j} indices")
        _same(got[1][j], wv, f"{j} values")
        assert (got[2][j], got[3][j]) == (wt, wp), (j, got[2][j], wt, got[3][j], wp)
    assert set(got[3]) == {1, 2}, got[3]


# ---- the codec, the memory and the exchange ------------------------------------------------------

def test_codec_decode_mean_list_many_equals_native():
    twin, native = dgc_mod.DGCCodec("twin", density=0.05, seed=2), dgc_mod.DGCCodec("native", density=0.05, seed=2)
    cpu = [torch.device("cpu")]
    assert twin.bucket_ops(cpu) and not native.bucket_ops(cpu) and not dgc_mod.DGCCodec("reference").bucket_ops(cpu)
    gen = torch.Generator().manual_seed(6)
    shapes, dtypes = [(0,), (1,), (7,), (31, 3), (33,), (8193,), (16, 3, 3, 3)], DTYPES * 2
    grads = [torch.randn(s, generator=gen, dtype=torch.float64).to(dt) for s, dt in zip(shapes, dtypes)]
    K = 3
    payloads = [[native.encode(g * (r + 1)) for r in range(K)] for g in grads]
    outs = [None, torch.empty_like(grads[1])] + [None] * (len(grads) - 2)
    got = twin.decode_mean_list_many(payloads, outs=outs)
    want = native.decode_mean_list_many(payloads)
    assert got[1] is outs[1]
    for t, (a, b) in enumerate(zip(got, want)):
        _same(a, b, f"tensor {t}")
        _same(a, native.decode_mean_list(payloads[t]), f"tensor {t} per tensor")
    with pytest.raises(ValueError, match="one K ranks"):
        twin.decode_mean_list_many([payloads[0], payloads[1][:2]])


@pytest.mark.parametrize("momentum, masking, nesterov", [(0.9, True, False), (0.9, False, True), (0.0, True, False)])
def test_memory_encode_many_equals_native(D, momentum, masking, nesterov):
    """DGCMemory.encode_many through the twin's bucket ops (momentum correction and masking once
    per bucket) gives the native CPU kernels' per-tensor payloads and state, over three steps;
    its momentum correction is one device call and its masking one."""
    shapes = [(0,), (1,), (7,), (31,), (32,), (33,), (8193,), (40, 30)]
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16] * 2
    names = [f"p{i}" for i in range(len(shapes))]
    codecs = {impl: dgc_mod.DGCCodec(impl, density=0.1, seed=9) for impl in ("twin", "native")}
    mems = {impl: DGCMemory(DensitySchedule(0.1), momentum=momentum, nesterov=nesterov, momentum_masking=masking)
            for impl in codecs}
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        grads = [torch.randn(s, generator=gen, dtype=torch.float64).to(dt) for s, dt in zip(shapes, dtypes)]
        positions = [step * len(names) + i for i in range(len(names))]
        out = {impl: mems[impl].encode_many(codecs[impl], names, grads, None, positions) for impl in codecs}
        for t in range(len(names)):
            for b in ("indices", "values"):
                _same(out["twin"][t].buffers[b], out["native"][t].buffers[b], f"step {step} {names[t]} {b}")
        for store in ("accumulations", "velocities"):
            a, b = getattr(mems["twin"], store), getattr(mems["native"], store)
            assert a.keys() == b.keys()
            for n in a:
                _same(a[n], b[n], f"step {step} {store} {n}")


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_memory_encode_many_device_calls_do_not_grow_with_its_tensor_count(D, momentum):
    """A whole DGCMemory.encode_many step through the twin: momentum correction 1 call per dtype
    (fp32, fp64: 2; none with momentum 0, a torch add), selection 6, index coding 3, masking 1,
    the same for 3 and 40 tensors (and the codec's encode_many: selection and coding, 9); the
    payloads and state bitwise impl="native"'s."""
    want = (2 if momentum else 0) + 6 + 3 + 1
    for count in (3, 40):
        shapes = [(1000,), (40, 25), (999,), (7,), (33,)]
        shapes = [shapes[t % len(shapes)] for t in range(count)]
        dtypes = [(torch.float32, torch.float64, torch.float16, torch.bfloat16)[t % 4] for t in range(count)]
        names = [f"p{i}" for i in range(count)]
        codecs = {impl: dgc_mod.DGCCodec(impl, density=0.05, seed=3) for impl in ("twin", "native")}
        mems = {impl: DGCMemory(DensitySchedule(0.05), momentum=momentum) for impl in codecs}
        for step in range(2):
            gen = torch.Generator().manual_seed(step)
            grads = [torch.randn(s, generator=gen, dtype=torch.float64).to(dt) for s, dt in zip(shapes, dtypes)]
            positions = [step * count + i for i in range(count)]
            out = {}
            calls = device_calls(D, lambda: out.__setitem__("twin", mems["twin"].encode_many(
                codecs["twin"], names, grads, None, positions)))
            out["native"] = mems["native"].encode_many(codecs["native"], names, grads, None, positions)
            assert calls == want, (count, step, calls)
            for t in range(count):
                for b in ("indices", "values"):
                    _same(out["twin"][t].buffers[b], out["native"][t].buffers[b], f"{count} {step} {t} {b}")
            for n in names:
                _same(mems["twin"].accumulations[n], mems["native"].accumulations[n], f"{count} {step} v {n}")
            assert codecs["twin"].counter == codecs["native"].counter
            assert (codecs["twin"].last_threshold, codecs["twin"].last_path) == \
                (codecs["native"].last_threshold, codecs["native"].last_path)
        vs = [torch.randn(s, dtype=torch.float64).to(dt) for s, dt in zip(shapes, dtypes)]
        got = []
        assert device_calls(D, lambda: got.append(codecs["twin"].encode_many(vs, positions=list(range(count))))) == 9
        want_payloads = codecs["native"].encode_many(vs, positions=list(range(count)))
        for t in range(count):
            for b in ("indices", "values"):
                _same(got[0][t].buffers[b], want_payloads[t].buffers[b], f"codec {count} {t} {b}")


def test_a_one_rank_exchange_through_the_bucket_ops_matches_native(D, monkeypatch):
    """Whole steps through the engine (allgatherv pattern, DGCMemory.encode_many, the bucket
    decode-mean): Compression.dgc with impl="twin" gives impl="native"'s results bitwise, through
    the twin's bucket ops only (never its per-tensor decode-sum, accumulation, selection, index
    coding)."""
    used = {}
    for op in ("dgc_decode_sum_many", "dgc_accumulate_many_", "dgc_mask_many_", "dgc_scatter_sum",
               "dgc_accumulate_", "dgc_select_many", "dgc_index_encode_many", "dgc_select", "dgc_index_encode"):
        real = getattr(D, op)
        monkeypatch.setattr(D, op, lambda *a, _real=real, _op=op, **k: (used.__setitem__(_op, used.get(_op, 0) + 1),
                                                                        _real(*a, **k))[1])
    shapes = {"a": (300, 40), "b": (77,), "c": (16, 3, 3, 3), "d": (1,), "e": (33,)}
    named = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in shapes.items()]
    comps = {impl: hgc.Compression.dgc(named, density=0.05, momentum=0.9, check_optimizer=False,
                                       communicator=OneRank(), impl=impl) for impl in ("twin", "native")}
    for step in range(3):
        gen = torch.Generator().manual_seed(30 + step)
        grads = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
        out = {impl: comps[impl].exchange({n: g.clone() for n, g in grads.items()}) for impl in comps}
        for n in shapes:
            _same(out["twin"][n], out["native"][n], f"step {step} {n}")
    assert used.get("dgc_decode_sum_many", 0) >= 3 and used.get("dgc_accumulate_many_", 0) >= 3, used
    assert used.get("dgc_mask_many_", 0) >= 3 and "dgc_scatter_sum" not in used and "dgc_accumulate_" not in used, used
    assert used.get("dgc_select_many", 0) >= 3 and used.get("dgc_index_encode_many", 0) >= 3, used
    assert "dgc_select" not in used and "dgc_index_encode" not in used, used
