"""Independent oracles of pieces the CPU kernels and the device sources share (issue 32 item 4):
a bug in a shared header is the same on both sides, so the bitwise twin test cannot see it.
Each model is plain numpy / Python, written from the spec (docs, ALGORITHMS.md, the codecs' module
docs and the order the headers' comments state), not from the headers' code, and checked against
the CPU kernels (torch.ops.hgc) and the twin (torch.ops.hgc_twin). ci/planted_faults.py plants a
one-line fault in each helper and shows these tests fail (docs/results/planted_faults.md).

- csrc/dgc_accumulate_step.h (DGC's momentum correction of one value): every product and sum
  rounded on its own in the tensor's dtype; non-finite values, momentum 0, sizes 0, 1, 7, 8193.
- csrc/splitmix64.h and the counter-based stream of QSGD's stochastic rounding: value i of a
  tensor draws the low (i even) or high (i odd) 32 bits of mix64(key + (i // 2 + 1) * golden),
  and rounds its level up when (word >> 8) < frac * 2^24 (QSGD's levels, recovered from the
  decoded values of inputs whose levels are exact in float).
- onebit's column statistics (csrc/device/onebit_functors.h: the row-block / lane summation order
  and finish_column), tests/oracles_onebit.py.
- TernGrad's fixed-order sums (lanes, BlockSum) and its random stream (mix32, the uniforms and the
  2-bit codes), tests/oracles_terngrad.py.
- QSGD's Elias reader (csrc/elias_bit_reader.h) through the Elias decode: hand-built, truncated,
  malformed and fuzzed streams, values or the decoder's error, tests/oracles_elias.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from horovod_gradcomp.native import require_native, require_twin


def accumulate_model(u, v, g, m, c, nesterov):
    """DGC momentum correction, one rounding per operation in the arrays' dtype:
    h = g * c (when c != 1); u' = u * m + h; v' = v + u' (nesterov: v' = (v + h) + u' * m)."""
    t = u.dtype.type
    m, c = t(m), t(c)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN follow IEEE, as in the kernels
        h = g * c if c != t(1) else g.copy()
        un = (u * m) + h
        vn = (v + h) + (un * m) if nesterov else v + un
    return un, vn


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("coef", [1.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_dgc_accumulate_step_against_model(kernels, nesterov, coef, dtype):
    mod = require_native() if kernels == "native" else require_twin()
    gen = torch.Generator().manual_seed(7)
    # edge values: zeros, signed zero, tiny (subnormal products), huge, and ordinary values
    base = torch.randn(1000, generator=gen, dtype=torch.float64) * 10
    special = torch.tensor([0.0, -0.0, 1e-38, -1e-38, 3e38, -3e38, 1e-310, 1.0, -1.0, 0.1], dtype=torch.float64)
    g = torch.cat([special, base]).to(dtype)
    u = torch.cat([special.flip(0), base.roll(3)]).to(dtype)
    v = torch.cat([special, base.roll(5)]).to(dtype)
    m = 0.9
    eu, ev = accumulate_model(u.numpy().copy(), v.numpy().copy(), g.numpy(), m, coef, nesterov)
    uu, vv = u.clone(), v.clone()
    mod.dgc_accumulate_(uu, vv, g, m, nesterov, coef)
    np.testing.assert_array_equal(uu.numpy().view(np.uint8), eu.view(np.uint8))
    np.testing.assert_array_equal(vv.numpy().view(np.uint8), ev.view(np.uint8))
    uu, vv = u.clone(), v.clone()
    mod.dgc_accumulate_many_([uu], [vv], [g], m, nesterov, coef)
    np.testing.assert_array_equal(uu.numpy().view(np.uint8), eu.view(np.uint8))
    np.testing.assert_array_equal(vv.numpy().view(np.uint8), ev.view(np.uint8))


GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def mix64(z: int) -> int:
    """splitmix64's finalizer (Steele, Lea and Flood 2014; Vigna's constants)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def qsgd_levels_model(x, s, key):
    """QSGD's level of each value of x (a bucket whose max |x| is 1, max_norm): r = |x| * s,
    floor capped at s - 1, plus one when the value's random word says so."""
    levels = []
    for i, xi in enumerate(x):
        r = min(abs(xi) * s, s)
        fl = min(int(r), s - 1)
        h = mix64((key + (i // 2 + 1) * GOLDEN) & MASK)
        word = (h >> 32) if i % 2 else (h & 0xFFFFFFFF)
        levels.append(fl + (1 if (word >> 8) < (r - fl) * 2 ** 24 else 0))
    return levels


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("key", [0, 12345, -5, (1 << 62) + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_qsgd_random_stream_against_model(kernels, key, dtype):
    mod = require_native() if kernels == "native" else require_twin()
    s = 7
    # fractions k/64 (exact levels r = 7k/64 in float); 1.0 first makes the max norm 1
    x = [1.0] + [((-1) ** k) * (k % 64) / 64 for k in range(1, 203)]
    t = torch.tensor(x, dtype=dtype)
    norms, packed = mod.qsgd_encode_fixed(t, s, len(x), True, key)
    assert norms.tolist() == [1.0]
    dec = mod.qsgd_decode_fixed(norms[None], packed[None], len(x), s, len(x), dtype, 1.0)
    got = [round(abs(v) * s) for v in dec.double().tolist()]
    assert got == qsgd_levels_model(x, s, key & MASK)


# ---- helpers of the models below ---------------------------------------------------------------

DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64"}


def modules(kernels):
    return require_native() if kernels == "native" else require_twin()


def exact_numpy(t: torch.Tensor) -> np.ndarray:
    """t's values as a numpy array that holds them exactly (fp16/bf16 widened to float32)."""
    return (t.double() if t.dtype == torch.float64 else t.float()).numpy()


def assert_same_floats(got: np.ndarray, want: np.ndarray):
    """Equal bit for bit, except that any NaN matches any NaN (the NaN policy is where NaNs
    land, not their payload)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    np.testing.assert_array_equal(nan_got, nan_want)
    ints = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan_got].view(ints), want[~nan_want].view(ints))


def mixed_values(n: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    """n values of many magnitudes (so that the summation order shows in the result)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    return (x * torch.exp(torch.randn(n, generator=gen, dtype=torch.float64) * 6)).to(dtype)


EDGES = [0.0, -0.0, 1e-45, -1e-45, 3e38, 3e38, -3e38, 1.0, -1.0, 1e-30]


# ---- onebit: the summation order (row blocks, lanes) and finish_column ----------------------------

# (n, groups, by_rows): one-column tensors of 0, 1, 7, 8k + 1 values (several row blocks of the
# lane view, a partial last row), matrices across row blocks and the CPU's 1024-column tile, rows mode.
ONEBIT_CASES = [(0, 1, False), (1, 1, False), (7, 1, False), (16385, 1, False), (40001, 1, False),
                (7, 7, False), (257 * 3, 3, False), (129 * 1025, 1025, False), (300 * 2, 300, False),
                (40 * 37, 40, True), (3 * 4099, 3, True), (5 * 1, 5, True), (200 * 2050, 200, True)]


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("case", ONEBIT_CASES, ids=lambda c: f"n{c[0]}-g{c[1]}{'-rows' if c[2] else ''}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_onebit_scales_against_model(kernels, case, dtype):
    from oracles_onebit import scales

    mod = modules(kernels)
    n, groups, by_rows = case
    g = mixed_values(n, 11, dtype)
    if n >= 2 * len(EDGES):  # extreme values (sums that overflow float32, subnormals, signed zeros)
        g[3:3 + len(EDGES)] = torch.tensor(EDGES, dtype=torch.float64).to(dtype)
    r = mixed_values(n, 12, dtype)
    want = scales(exact_numpy(g), exact_numpy(r), groups, by_rows, DTYPE_NAMES[dtype])
    assert_same_floats(mod.onebit_scales(g, r, groups, by_rows).numpy(), want)
    assert_same_floats(mod.onebit_scales_many([g], [r], [groups], [by_rows])[0].numpy(), want)
    rr = r.clone()
    _, enc_scales = mod.onebit_encode(g, rr, groups, None, by_rows)
    assert_same_floats(enc_scales.numpy(), want)
    want_plain = scales(exact_numpy(g), None, groups, by_rows, DTYPE_NAMES[dtype])
    assert_same_floats(mod.onebit_scales(g, None, groups, by_rows).numpy(), want_plain)


def test_onebit_model_order_shows_in_the_data():
    """The data above tell the order apart: another row block or lane count, or the column sums
    in float64 throughout, give other scales for many groups (so the kernels' agreement on the
    same data pins the order down)."""
    from oracles_onebit import ROW_BLOCK, LANES, scales

    rows = exact_numpy(mixed_values(200 * 2050, 11, torch.float32))  # ONEBIT_CASES' rows-mode case
    base = scales(rows, None, 200, True, "float32")
    assert (base != scales(rows, None, 200, True, "float32", row_block=ROW_BLOCK // 2)).sum() > 20
    assert (base != scales(rows, None, 200, True, "float32", lanes=LANES // 2)).sum() > 20
    mat = exact_numpy(mixed_values(129 * 1025, 11, torch.float32))  # ONEBIT_CASES' widest matrix
    base = scales(mat, None, 1025, False, "float32")
    assert (base != scales(mat, None, 1025, False, "float32", row_block=ROW_BLOCK // 2)).sum() > 100
    wide = scales(mat.astype(np.float64), None, 1025, False, "float64").astype(np.float32)
    assert (base != wide).sum() > 100


# Columns of a [rows, cols] matrix, one edge case each (finish_column's policy): all non-negative
# (a- = 0), all negative (a+ = 0), signed zeros (-0.0 counts as non-negative), a NaN (to the
# negative side: a- NaN), +inf and -inf, float32 overflow of a block sum, sub-normal means, and
# quotients that round (p / c in float64, then to float32 once).
FINISH_COLUMNS = [
    [1.0, 2.0, 3.0, 0.0, 5.0, 0.5, 0.25],
    [-1.0, -2.0, -3.0, -4.0, -5.0, -0.5, -0.25],
    [0.0, -0.0, -0.0, 0.0, -0.0, -0.0, -0.0],
    [1.0, float("nan"), -1.0, 2.0, -2.0, 3.0, -3.0],
    [float("inf"), 1.0, -1.0, float("-inf"), 2.0, -2.0, 0.0],
    [3e38, 3e38, -3e38, -3e38, 1.0, -1.0, 3e38],
    [1e-45, 1e-45, -1e-45, 0.0, 3e-45, -3e-45, 1e-45],
    [1.0, 1.0, 1.0, 2.0, -1.0, -1.0, -2.0],
    [0.1, 0.7, 1.3, -0.3, -0.9, 0.2, -0.4],
    [1e-38, 3e-39, 2e-40, -1e-38, -3e-39, -2e-40, 0.0],
]


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_onebit_finish_column_edges(kernels, dtype):
    from oracles_onebit import scales

    mod = modules(kernels)
    cols = torch.tensor(FINISH_COLUMNS, dtype=torch.float64).t().contiguous()  # [rows, cols]
    if dtype == torch.float64:  # means beyond float32's range: float32(p / c) is inf / 0
        cols = torch.cat([cols, torch.tensor([[1e300, -1e-300]] * cols.shape[0], dtype=torch.float64)], 1)
    g = cols.to(dtype).flatten()
    groups = cols.shape[1]
    want = scales(exact_numpy(g), None, groups, False, DTYPE_NAMES[dtype])
    assert_same_floats(mod.onebit_scales(g, None, groups).numpy(), want)
    # the columns as rows (rows mode), and each column alone as a one-column tensor
    t = cols.t().contiguous().to(dtype).flatten()
    assert_same_floats(mod.onebit_scales(t, None, groups, True).numpy(),
                       scales(exact_numpy(t), None, groups, True, DTYPE_NAMES[dtype]))
    for j in range(groups):
        c = cols[:, j].contiguous().to(dtype)
        assert_same_floats(mod.onebit_scales(c, None, 1).numpy(), scales(exact_numpy(c), None, 1, False,
                                                                          DTYPE_NAMES[dtype]))
    # the policy itself, spelled out for a few columns
    w = want.reshape(2, groups)
    assert w[0, 0] == np.float32(11.75 / 7) and w[1, 0] == 0
    assert w[0, 1] == 0 and w[1, 1] == np.float32(-15.75 / 7)
    assert w[0, 2] == 0 and not np.signbit(w[0, 2]) and w[1, 2] == 0
    assert np.isnan(w[1, 3]) and not np.isnan(w[0, 3])


# ---- TernGrad: the fixed-order sums (lanes, BlockSum) and the random stream ------------------------

TERNGRAD_SIZES = [0, 1, 7, 8193, 65536, 65537, 200003]


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("n", TERNGRAD_SIZES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_terngrad_fixed_order_sums_against_model(kernels, n, dtype):
    from oracles_terngrad import max_abs, sigma

    mod = modules(kernels)
    g = (mixed_values(n, 21) + 3.0).to(dtype)  # a mean away from 0: the squares' pass matters
    x = g.double().numpy()
    want_sigma, want_max = sigma(x), max_abs(x)
    assert mod.terngrad_sigma(g) == want_sigma
    assert mod.terngrad_max_abs(g) == want_max
    other = mixed_values(5, 22).to(dtype)
    stats = mod.terngrad_scale_stats_many([g, other, g[:0]], True)
    assert stats.dtype == torch.float64
    assert stats.tolist() == [[want_max, max_abs(other.double().numpy()), 0.0],
                              [want_sigma, sigma(other.double().numpy()), 0.0]]


@pytest.mark.parametrize("kernels", ["native", "twin"])
def test_terngrad_sums_nonfinite(kernels):
    """NaN anywhere: max |g| and sigma NaN; an inf: max inf, sigma NaN (inf - inf)."""
    from oracles_terngrad import max_abs, sigma

    mod = modules(kernels)
    for bad in (float("nan"), float("inf")):
        g = mixed_values(70001, 23)
        g[65536 + 17] = bad
        x = g.numpy()
        assert math.isnan(sigma(x))
        assert math.isnan(mod.terngrad_sigma(g))
        got, want = mod.terngrad_max_abs(g), max_abs(x)
        assert got == want or (math.isnan(got) and math.isnan(want))


def test_terngrad_model_order_shows_in_the_data():
    """The data above tell the order apart: other lane or block counts, or an exact sum, give
    another sigma (so the kernels' agreement pins the order down)."""
    from oracles_terngrad import SUM_BLOCK, SUM_LANES, fixed_order_sum, sigma

    for n in (8193, 65537, 200003):
        x = (mixed_values(n, 21) + 3.0).numpy()
        assert sigma(x) != sigma(x, block=SUM_BLOCK // 2)
        if n > SUM_LANES:
            assert sigma(x) != sigma(x, lanes=SUM_LANES // 2)
            assert fixed_order_sum(x) != math.fsum(x)


TERNGRAD_KEYS = [(0, 0), (12345, 0xFFFFFFFF), (0xFFFFFFF0, 7), (0x9E3779B9, 0x7F4A7C15)]


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("keys", TERNGRAD_KEYS, ids=lambda k: f"{k[0]:x}-{k[1]:x}")
@pytest.mark.parametrize("n", [0, 1, 7, 33, 8193])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_terngrad_random_stream_against_model(kernels, keys, n, dtype):
    from oracles_terngrad import encode_codes

    mod = modules(kernels)
    key0, key1 = keys
    acc = np.float64 if dtype == torch.float64 else np.float32
    s = 2.0
    gen = torch.Generator().manual_seed(31 + n)
    g = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * s  # |g| uniform in [0, s]
    if n >= 33:  # edges: zeros, NaN (never selected), +-inf, +-s (always selected)
        g[:8] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), s, -s, 1e-30])
    g = g.to(dtype)
    x = exact_numpy(g)
    for clip in (float("inf"), 0.75):
        want = encode_codes(x, s, clip, key0, key1, acc)
        codes, scales = mod.terngrad_encode(g, s, clip, key0, key1)
        np.testing.assert_array_equal(codes.numpy(), want)
        assert scales.tolist() == [s]
        codes_many, _ = mod.terngrad_encode_many([g, g[: n // 2].clone()], [s, s], [clip, clip], [key0, key0],
                                                 [key1, key1])
        np.testing.assert_array_equal(codes_many[0].numpy(), want)
        np.testing.assert_array_equal(codes_many[1].numpy(), encode_codes(x[: n // 2], s, clip, key0, key1, acc))
    zero, _ = mod.terngrad_encode(g, 0.0, float("inf"), key0, key1)
    assert not zero.any()


def test_terngrad_model_stream_shows_in_the_codes():
    """The codes depend on every part of the stream: another key, another shift of the word or
    another first multiplier changes them (so the kernels' agreement pins the stream down)."""
    import oracles_terngrad as T

    x = ((torch.rand(8193, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2 - 1) * 2).float()
    x = x.numpy()
    base = T.encode_codes(x, 2.0, float("inf"), 12345, 99, np.float32)
    assert not np.array_equal(base, T.encode_codes(x, 2.0, float("inf"), 12346, 99, np.float32))
    assert not np.array_equal(base, T.encode_codes(x, 2.0, float("inf"), 12345, 98, np.float32))
    u = T.uniforms(8193, 12345, 99, np.float32)
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(float(u.mean()) - 0.5) < 0.02


# ---- QSGD's Elias reader (csrc/elias_bit_reader.h) through qsgd_decode_elias ------------------------

def _elias_decode(mod, norms, nbits, stream, n, s, d, gb, dtype=torch.float32):
    return mod.qsgd_decode_elias(torch.tensor(norms, dtype=torch.float32), torch.tensor(nbits, dtype=torch.int64),
                                 torch.tensor(list(stream), dtype=torch.uint8), n, s, d, gb, dtype)


def _elias_expect(mod, norms, nbits, stream, n, s, d, gb, dtype=torch.float32):
    """Decodes with the kernels and the model: equal values, or the model's error in the kernels' message."""
    import oracles_elias as E

    try:
        q = E.levels(nbits, stream, n, s, d, gb)
    except E.EliasError as err:
        with pytest.raises(RuntimeError, match=str(err).split(" (")[0]):
            _elias_decode(mod, norms, nbits, stream, n, s, d, gb, dtype)
        return None
    acc = np.float64 if dtype == torch.float64 else np.float32
    want = E.values(q, np.asarray(norms, np.float32), s, d, acc)
    want = want.astype({torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}[dtype])
    got = _elias_decode(mod, norms, nbits, stream, n, s, d, gb, dtype)
    assert_same_floats(got.numpy(), want)
    return q


def _random_levels(n, s, density, seed):
    rng = np.random.default_rng(seed)
    q = rng.integers(1, s + 1, n) * rng.choice([-1, 1], n)
    q[rng.random(n) >= density] = 0
    return q.tolist()


# (n, bucket d, group_buckets, s, density): sizes 1, 7, 8k + 1; one value per bucket; the largest
# levels (gamma codes of 2 * 23 + 1 bits); empty buckets; a partial last bucket and group.
ELIAS_CASES = [(1, 1, 1, 1, 1.0), (7, 3, 2, 5, 0.6), (8193, 512, 3, 127, 0.3), (8193, 64, 1, (1 << 24) - 1, 0.5),
               (100, 1, 7, 3, 0.5), (600, 200, 2, 9, 0.0), (1000, 1000, 1, 1, 1.0), (4097, 4096, 1, 2, 0.01)]


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("case", ELIAS_CASES, ids=lambda c: f"n{c[0]}-d{c[1]}-g{c[2]}-s{c[3]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_elias_reader_hand_built_streams(kernels, case, dtype):
    import oracles_elias as E

    mod = modules(kernels)
    n, d, gb, s, density = case
    q = _random_levels(n, s, density, n + d)
    nbits, groups = E.encode(q, d, gb)
    stream = b"".join(E.pack(bits) for bits in groups)
    B = -(-n // d)
    norms = [float(1 + b % 5) for b in range(B)]
    if B > 2:
        norms[1] = float("inf")  # its zeros decode to 0 * inf = NaN, its levels to +-inf
    assert _elias_expect(mod, norms, nbits, stream, n, s, d, gb, dtype).tolist() == q


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("s", [1, 7, 255])
def test_elias_model_reads_the_kernels_streams(kernels, s):
    """The model decodes what the kernels encode, and the kernels' decode matches it."""
    mod = modules(kernels)
    x = torch.randn(20000, generator=torch.Generator().manual_seed(41))
    norms, nbits, stream = mod.qsgd_encode_elias(x, s, 512, True, 99, 16)
    q = _elias_expect(mod, norms.tolist(), nbits.tolist(), bytes(stream.numpy()), 20000, s, 512, 16)
    assert np.count_nonzero(q) > 1000


def _hand_cases():
    """(name, n, d, gb, s, nbits, stream bytes): malformed and edge streams built bit by bit. The
    reader's long-code path (a gamma of 2N + 1 > 57 bits) can only end in "malformed" at QSGD's
    sizes (levels below 2^24, N >= 29 needs a bucket of 2^29 values): the "31 zeros" case takes it."""
    import oracles_elias as E

    g, P = E.gamma_bits, E.pack
    good = g(3) + g(1) + [0] + g(2) + g(2) + [1] + g(3)  # 2 nonzeros: +2 at 0, -3 at 2 (d = 4, s = 3)
    cases = [
        ("valid", 4, 4, 1, 3, [len(good)], P(good)),
        ("truncated by one bit", 4, 4, 1, 3, [len(good) - 1], P(good)),
        ("truncated to its bytes", 4, 4, 1, 3, [8 * (len(good) // 8)], P(good)[:len(good) // 8]),
        ("one bit too many", 4, 4, 1, 3, [len(good) + 1], P(good + [0])),
        ("trailing one bit", 4, 4, 1, 3, [len(good) + 1], P(good + [1])),
        ("empty stream", 4, 4, 1, 3, [0], b""),
        ("header above the bucket", 4, 4, 1, 3, [len(g(6))], P(g(6))),
        ("header of a full bucket", 2, 2, 1, 1, [len(g(3) + (g(1) + [0] + g(1)) * 2)], P(g(3) + (g(1) + [0] + g(1)) * 2)),
        ("gap past the bucket", 4, 4, 1, 3, [len(g(2) + g(5) + [0] + g(1))], P(g(2) + g(5) + [0] + g(1))),
        ("last position", 4, 4, 1, 3, [len(g(2) + g(4) + [1] + g(3))], P(g(2) + g(4) + [1] + g(3))),
        ("level above s", 4, 4, 1, 3, [len(g(2) + g(1) + [0] + g(4))], P(g(2) + g(1) + [0] + g(4))),
        ("level s", 4, 4, 1, 3, [len(g(2) + g(1) + [0] + g(3))], P(g(2) + g(1) + [0] + g(3))),
        ("32 zeros (no gamma)", 4, 4, 1, 3, [40], P([0] * 32 + [1] + [0] * 7)),
        ("31 zeros (a gamma too large)", 4, 4, 1, 3, [63], P([0] * 31 + [1] + [0] * 31)),
        ("sign bit past the end", 4, 4, 1, 3, [len(g(2) + g(1))], P(g(2) + g(1) + [1] + g(1))),
        ("level past the end", 4, 4, 1, 3, [len(g(2) + g(1)) + 1], P(g(2) + g(1) + [1] + g(1))),
        ("two groups", 8, 4, 1, 3, [len(good), len(g(1))], P(good) + P(g(1))),
        ("second group short", 8, 4, 1, 3, [len(good), 0], P(good)),
        ("group claims more than the stream", 4, 4, 1, 3, [8 * len(P(good)) + 1], P(good)),
        ("negative bit count", 4, 4, 1, 3, [-1], P(good)),
        ("stream longer than the header", 4, 4, 1, 3, [len(good)], P(good) + b"\0"),
        ("bit counts past the stream", 8, 4, 1, 3, [len(good), len(good)], P(good) + b"\0"),
    ]
    return cases


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("case", _hand_cases(), ids=lambda c: c[0])
def test_elias_reader_malformed_and_edge_streams(kernels, case):
    """Each hand-built stream decodes as the model says: values, or the error the decoder defines
    (malformed code; header that does not fit the stream)."""
    import oracles_elias as E

    name, n, d, gb, s, nbits, stream = case
    try:
        E.levels(nbits, stream, n, s, d, gb)
        valid = True
    except E.EliasError:
        valid = False
    assert valid == (name in ("valid", "header of a full bucket", "last position", "level s", "two groups")), name
    _elias_expect(modules(kernels), [2.0] * (-(-n // d)), nbits, stream, n, s, d, gb)


@pytest.mark.parametrize("kernels", ["native", "twin"])
def test_elias_reader_fuzz_against_model(kernels):
    """Valid streams, unchanged or with one random change (a bit flipped, the bit count moved, the
    stream cut or grown): the kernels agree with the model on every one, values or error."""
    import oracles_elias as E

    mod = modules(kernels)
    rng = np.random.default_rng(5)
    outcomes = {"values": 0, "error": 0}
    for trial in range(300):
        n, d, gb, s = int(rng.integers(1, 300)), int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 20))
        q = _random_levels(n, s, float(rng.random()), trial)
        nbits, groups = E.encode(q, d, gb)
        g = int(rng.integers(0, len(groups)))
        bits = list(groups[g])
        kind = trial % 5
        if kind == 0 and bits:
            bits[int(rng.integers(0, len(bits)))] ^= 1
        elif kind == 1:
            nbits[g] = max(0, nbits[g] + int(rng.integers(-3, 4)))
        elif kind == 2:
            bits = bits[: int(rng.integers(0, len(bits) + 1))]
            nbits[g] = len(bits)
        elif kind == 3:
            bits = bits + [int(b) for b in rng.integers(0, 2, int(rng.integers(1, 12)))]
            nbits[g] = len(bits)
        groups[g] = bits
        stream = b"".join(E.pack(b) for b in groups)
        got = _elias_expect(mod, [1.0] * (-(-n // d)), nbits, stream, n, s, d, gb)
        outcomes["values" if got is not None else "error"] += 1
    assert outcomes["values"] > 60 and outcomes["error"] > 150, outcomes


# ---- DGC's accumulate step: non-finite values, momentum 0, sizes, a bucket of tensors --------------

@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.9, 0.999])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_dgc_accumulate_nonfinite_and_sizes(kernels, nesterov, momentum, dtype):
    mod = modules(kernels)
    sizes = [0, 1, 7, 8193]
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-45, 3e38], dtype=torch.float64)
    gs, us, vs = [], [], []
    for k, n in enumerate(sizes):
        g, u, v = (mixed_values(n, 50 + 3 * k + j) for j in range(3))
        if n >= 7:
            g[:7], u[:7], v[:7] = special, special.roll(2), special.roll(4)
        gs.append(g.to(dtype)), us.append(u.to(dtype)), vs.append(v.to(dtype))
    for coef in (1.0, 0.5):
        want = [accumulate_model(u.numpy().copy(), v.numpy().copy(), g.numpy(), momentum, coef, nesterov)
                for u, v, g in zip(us, vs, gs)]
        uu, vv = [u.clone() for u in us], [v.clone() for v in vs]
        mod.dgc_accumulate_many_(uu, vv, gs, momentum, nesterov, coef)
        for (eu, ev), u, v in zip(want, uu, vv):
            assert_same_floats(u.numpy(), eu)
            assert_same_floats(v.numpy(), ev)
        for (eu, ev), u, v, g in zip(want, us, vs, gs):
            u, v = u.clone(), v.clone()
            mod.dgc_accumulate_(u, v, g, momentum, nesterov, coef)
            assert_same_floats(u.numpy(), eu)
            assert_same_floats(v.numpy(), ev)
