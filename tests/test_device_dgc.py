"""DGC's device kernels (csrc/device/dgc_device.cu) on the OpenMP twin against the CPU kernels.

Bitwise: the selection (indices, values, threshold, path) over densities, sample sizes and
sizes, ties, zeros and non-finite values; the decode-sum of K = 1..8 payloads; the index code
(1-byte, 2-byte and absolute, int32 and int64 indices); the momentum correction (nesterov on
and off) -- each at 1, 2 and 4 threads, for the CPU kernels and the twin alike (every quantity
that decides a DGC payload is an integer, so neither depends on the thread count). Also: the
number of device algorithm calls of an op does not grow with the tensor, and
``DGCCodec.accumulate_``'s choice of kernel or torch ops (review B.1).
"""
from __future__ import annotations

import math

import pytest
import torch

from horovod_gradcomp.codecs import dgc as dgc_mod
from horovod_gradcomp.native import require_native, require_twin
from device_helpers import D  # noqa: F401 (fixture)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
THREADS = [1, 2, 4]


@pytest.fixture(params=THREADS, ids=lambda t: f"threads{t}")
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)  # also the OpenMP threads of the twin's calls (one libgomp)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def C():
    return require_native()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(_bytes(a), _bytes(b)), f"{what}: bytes differ"


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _tensor(kind: str, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    if kind == "heavy":  # a heavy tail: the sample's estimate is often off
        x = x ** 5
    elif kind == "ties":  # four magnitudes: large ties at every threshold (path 1)
        x = torch.randint(-3, 4, (n,), generator=gen).double()
    elif kind == "sparse":  # a few nonzeros among zeros (path 2: the sample sees none)
        x = torch.zeros(n, dtype=torch.float64)
        x[torch.randperm(n, generator=gen)[: max(1, n // 2000)]] = 1.0 + torch.rand(max(1, n // 2000), generator=gen, dtype=torch.float64)
    elif kind == "zeros":
        x = torch.zeros(n, dtype=torch.float64)
    elif kind == "nonfinite":
        x[:: max(1, n // 7)] = math.inf
        x[3 :: max(1, n // 5)] = -math.inf
        x[5 :: max(1, n // 3)] = math.nan
    x = x.to(dtype)
    if kind == "nonfinite":  # negative NaNs too (their keys clear the sign)
        x[1::11] = -x[1::11].abs()
    return x


SELECT_CASES = [
    # (kind, n, density, sample)
    ("normal", 1, 0.01, 0.01),
    ("normal", 7, 0.5, 0.01),
    ("normal", 33, 0.1, 0.05),
    ("normal", 8001, 0.01, 0.05),
    ("normal", 100_003, 0.001, 0.01),
    ("normal", 100_003, 0.01, 0.01),
    ("normal", 100_003, 0.1, 0.02),
    ("normal", (1 << 20) + 3, 0.001, 0.01),
    ("heavy", 200_001, 0.001, 0.005),
    ("heavy", 200_001, 0.02, 0.05),
    ("ties", 100_003, 0.01, 0.01),
    ("ties", 100_003, 0.3, 0.01),
    ("sparse", 300_001, 0.01, 0.01),
    ("sparse", 300_001, 0.0001, 0.01),
    ("zeros", 50_001, 0.01, 0.01),
    ("zeros", 100, 0.01, 0.01),
    ("nonfinite", 100_003, 0.01, 0.01),
    ("nonfinite", 1000, 0.05, 0.01),
    ("normal", 5000, 1.0, 0.01),  # k = n: every nonzero value
]


def _select_args(n, density, sample, seed):
    k = dgc_mod.target_count(n, density)
    return k, dgc_mod.sample_count(n, density, sample), (0x9E3779B97F4A7C15 * (seed + 1)) % (1 << 63)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_select_equals_cpu(C, D, threads, dtype):
    paths = set()
    for i, (kind, n, density, sample) in enumerate(SELECT_CASES):
        x = _tensor(kind, n, dtype, seed=i)
        k, m, key = _select_args(n, density, sample, i)
        for m_ in sorted({m, 0, min(n, 512)}):  # the codec's sample count, exact, a small sample
            if m_ and 8 * m_ >= n:
                continue
            want, got = C.dgc_select(x, k, m_, key), D.dgc_select(x, k, m_, key)
            what = f"{kind} n={n} k={k} m={m_}"
            _same(got[0], want[0], f"{what}: indices")
            _same(got[1], want[1], f"{what}: values")
            assert _same_float(got[2], want[2]), f"{what}: threshold {got[2]} vs {want[2]}"
            assert got[3] == want[3], f"{what}: path {got[3]} vs {want[3]}"
            paths.add(want[3])
    assert paths == {0, 1, 2}, f"the cases should take every path, took {paths}"


def test_select_empty_and_k_zero(C, D):
    for x, k in ((torch.zeros(0), 3), (torch.randn(10), 0)):
        want, got = C.dgc_select(x, k, 0, 1), D.dgc_select(x, k, 0, 1)
        _same(got[0], want[0], "indices")
        _same(got[1], want[1], "values")
        assert got[2:] == want[2:]


def _payloads(C, K, n, dtype, seed):
    """K payloads of one tensor size: CPU selections at several densities, an empty one (an
    all-zero tensor) when K > 2, and hand-made pairs with -0.0 and inf values."""
    out = []
    for r in range(K):
        if r == 2:
            x = torch.zeros(n, dtype=dtype)
        else:
            x = _tensor("heavy" if r % 2 else "normal", n, dtype, seed=seed + r)
        idx, vals, _, _ = C.dgc_select(x, max(1, n // (10 + 7 * r)), 0, r)
        if r == 3:
            vals = vals.clone()
            vals[:: 3] = -0.0
            vals[1:: 5] = math.inf
        out.append((idx, vals))
    return out


@pytest.mark.parametrize("K", range(1, 9))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_scatter_sum_equals_cpu(C, D, threads, dtype, K):
    for n, scale in ((1, 1.0), (33, 0.5), (70_001, 1.0 / K), ((1 << 17) + 5, 3.0)):
        pays = _payloads(C, K, n, dtype, seed=17 * K + n)
        idx, vals = [p[0] for p in pays], [p[1] for p in pays]
        want = C.dgc_scatter_sum(idx, vals, n, dtype, scale)
        _same(D.dgc_scatter_sum(idx, vals, n, dtype, scale), want, f"n={n} K={K}")
        out = torch.full((n,), 7.0, dtype=dtype)
        assert D.dgc_scatter_sum(idx, vals, n, dtype, scale, out).data_ptr() == out.data_ptr()
        _same(out, want, f"n={n} K={K} into out")


def test_scatter_sum_names_the_bad_payload(C, D):
    good = torch.tensor([1, 4, 9], dtype=torch.int32)
    for bad in ([3, 3], [4, 2], [-1, 2], [2, 50]):
        idx = [good, good, torch.tensor(bad, dtype=torch.int32), torch.tensor([5, 1], dtype=torch.int32)]
        vals = [torch.ones(3), torch.ones(3), torch.ones(2), torch.ones(2)]
        msgs = []
        for M in (C, D):
            with pytest.raises(RuntimeError) as e:
                M.dgc_scatter_sum(idx, vals, 50, torch.float32, 1.0)
            msgs.append(str(e.value).splitlines()[0])
        assert msgs[0] == msgs[1] and "payload 2:" in msgs[1], msgs


def _indices(n, count, spread, seed, dtype):
    """count strictly increasing indices in [0, n) whose gaps are in [1, spread], one of them
    spread (so the largest gap code is spread - 1)."""
    gen = torch.Generator().manual_seed(seed)
    gaps = torch.randint(1, spread + 1, (count,), generator=gen, dtype=torch.int64)
    gaps[count // 2] = spread
    idx = torch.cumsum(gaps, 0) - 1
    assert int(idx[-1]) < n
    return idx.to(dtype)


def test_index_code_equals_cpu(C, D, threads):
    n32, n64 = 1 << 30, (1 << 31) + 7
    cases = []
    for n, dt in ((n32, torch.int32), (n64, torch.int64)):
        cases += [
            (n, _indices(n, 1, 1, 0, dt), 1),
            (n, _indices(n, 70_000, 256, 1, dt), 1),       # every gap code < 256
            (n, _indices(n, 70_000, 257, 2, dt), 2),       # one reaches 256
            (n, _indices(n, 20_000, 65_536, 3, dt), 2),    # codes up to 65535
            (n, _indices(n, 20_000, 65_537, 4, dt), None),  # a code of 65536: absolute
            (n, torch.tensor([0, n - 1], dtype=dt), None),
        ]
    for n, idx, want_w in cases:
        code = C.dgc_index_encode(idx, n)
        absolute = idx.element_size()
        w = code.numel() // idx.numel()
        assert w == (want_w or absolute), (n, idx.numel(), w)
        _same(D.dgc_index_encode(idx, n), code, f"code of {idx.numel()} (w={w})")
        _same(D.dgc_index_decode(code, idx.numel(), n), idx, f"decode of {idx.numel()} (w={w})")
        # the code at an odd offset of a larger buffer (as a receive buffer holds it)
        shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), code])[1:]
        _same(D.dgc_index_decode(shifted, idx.numel(), n), idx, f"decode at an odd offset (w={w})")


def test_index_code_refusals_equal_cpu(C, D):
    u8, i32 = torch.uint8, torch.int32
    cases = [
        ("dgc_index_encode", (torch.tensor([5, 3], dtype=i32), 10)),
        ("dgc_index_encode", (torch.tensor([5, 10], dtype=i32), 10)),
        ("dgc_index_encode", (torch.tensor([-2, 3], dtype=i32), 10)),
        ("dgc_index_decode", (torch.full((5,), 255, dtype=u8), 5, 1000)),
        ("dgc_index_decode", (torch.full((8,), 255, dtype=u8), 4, 1000)),
        ("dgc_index_decode", (torch.full((5,), 255, dtype=u8), 5, (1 << 31) + 5)),
        ("dgc_index_decode", (torch.tensor([3, 3], dtype=i32).view(u8), 2, 10)),
        ("dgc_index_decode", (torch.tensor([1, 2], dtype=torch.int64).view(u8), 2, (1 << 31) + 5)),
    ]
    for fn, args in cases:
        outcomes = []
        for M in (C, D):
            try:
                r = getattr(M, fn)(*args)
                outcomes.append(("ok", r.tolist()))
            except RuntimeError as e:
                outcomes.append(("error", str(e).splitlines()[0]))
        assert outcomes[0] == outcomes[1], (fn, outcomes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_accumulate_equals_cpu(C, D, threads, dtype):
    gen = torch.Generator().manual_seed(3)
    n = 100_003
    g = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    for nesterov in (False, True):
        for coef in (1.0, 0.37):
            u, v = torch.randn(n, generator=gen, dtype=dtype), torch.randn(n, generator=gen, dtype=dtype)
            ud, vd = u.clone(), v.clone()
            for _ in range(3):
                C.dgc_accumulate_(u, v, g, 0.9, nesterov, coef)
                D.dgc_accumulate_(ud, vd, g, 0.9, nesterov, coef)
            _same(ud, u, f"u (nesterov={nesterov}, coef={coef})")
            _same(vd, v, f"v (nesterov={nesterov}, coef={coef})")


def test_codec_twin_equals_native(threads):
    """The codec with impl='twin' sends every kernel call to the twin: same payloads, same
    momentum correction, same decode."""
    nat, twin = dgc_mod.DGCCodec("native", density=0.01, seed=4), dgc_mod.DGCCodec("twin", density=0.01, seed=4)
    assert twin._C is require_twin()
    x = _tensor("normal", 65_537, torch.float32, seed=8)
    p_n, p_t = nat.encode(x), twin.encode(x)
    for name in p_n.buffers:
        _same(p_t.buffers[name], p_n.buffers[name], name)
    assert (twin.last_threshold, twin.last_path) == (nat.last_threshold, nat.last_path)
    _same(twin.decode_mean_list([p_t, p_n], 0.5), nat.decode_mean_list([p_n, p_t], 0.5), "decode")
    u, v = torch.zeros_like(x), torch.zeros_like(x)
    ut, vt = u.clone(), v.clone()
    nat.accumulate_(u, v, x, 0.9, True)
    twin.accumulate_(ut, vt, x, 0.9, True)
    _same(ut, u, "u")
    _same(vt, v, "v")


def test_accumulate_route_review_b1():
    """accumulate_ never asks an extension about CUDA unless impl='native' on a CUDA tensor
    (impl='reference' used to call self._C.has_cuda() and raise AttributeError)."""
    def no_call():
        raise AssertionError("has_cuda must not be called here")

    route = dgc_mod.accumulate_in_kernels
    f32 = torch.float32
    assert route("reference", "cuda", f32, no_call) is False
    assert route("reference", "cpu", f32, no_call) is False
    assert route("native", "cpu", f32, no_call) is True
    assert route("native", "cpu", torch.float16, no_call) is False
    assert route("twin", "cpu", f32, no_call) is True
    assert route("twin", "cuda", f32, no_call) is True  # the twin's op refuses it: never a silent fallback
    assert route("native", "cuda", f32, lambda: True) is True
    assert route("native", "cuda", f32, lambda: False) is False
    assert route("native", "cuda", torch.bfloat16, no_call) is False
    ref = dgc_mod.DGCCodec("reference")
    assert not hasattr(ref, "_C")
    u, v, g = torch.zeros(5), torch.zeros(5), torch.ones(5)
    ref.accumulate_(u, v, g, 0.5, False)
    assert torch.equal(u, g) and torch.equal(v, g)


def _calls(D, fn):
    before = D.algorithm_calls()
    fn()
    return D.algorithm_calls() - before


def test_algorithm_calls_do_not_grow_with_the_tensor(C, D):
    """Each op is a fixed number of device algorithm calls, whatever the tensor's size:
    select (sampled, path 0) 4, (exact) 4; decode-sum of K payloads K + 4; index encode 2,
    decode 3 (2-byte gaps); momentum correction 1."""
    counts = {}
    for n in (1 << 16, 1 << 20):
        x = _tensor("normal", n, torch.float32, seed=1)
        k, m, key = _select_args(n, 0.01, 0.01, 1)
        assert m > 0 and C.dgc_select(x, k, m, key)[3] == 0
        pays = [C.dgc_select(_tensor("normal", n, torch.float32, seed=r), n // 1000, 0, r)[:2] for r in range(3)]
        idx = [p[0] for p in pays]
        code = C.dgc_index_encode(idx[0], n)
        assert code.numel() == 2 * idx[0].numel()
        u, v = torch.zeros(n), torch.zeros(n)
        counts[n] = {
            "select sampled": _calls(D, lambda: D.dgc_select(x, k, m, key)),
            "select exact": _calls(D, lambda: D.dgc_select(x, k, 0, key)),
            "decode-sum K=3": _calls(D, lambda: D.dgc_scatter_sum(idx, [p[1] for p in pays], n, torch.float32, 1.0)),
            "index encode": _calls(D, lambda: D.dgc_index_encode(idx[0], n)),
            "index decode": _calls(D, lambda: D.dgc_index_decode(code, idx[0].numel(), n)),
            "accumulate": _calls(D, lambda: D.dgc_accumulate_(u, v, x, 0.9, False, 1.0)),
        }
    assert counts[1 << 16] == counts[1 << 20] == {
        "select sampled": 4, "select exact": 4, "decode-sum K=3": 7, "index encode": 2, "index decode": 3,
        "accumulate": 1}, counts
