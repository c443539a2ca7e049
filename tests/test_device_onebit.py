"""onebit's device kernels (csrc/device/onebit_*: Thrust over shared functors) on the OpenMP twin
(``_C_twin``, CPU tensors), bitwise against the native CPU kernels (``_C``).

The device kernels and the CPU kernel sum the column statistics in one fixed order
(csrc/device/onebit_functors.h: row blocks of 128 rows summed per column in float, the blocks
added in double in block order; a one-column tensor as 16 lanes), so bits, scales, residuals
and decodes are equal byte for byte, at any thread count. Also: the column windows of the
two-phase exchange, K = 1..8 stacked payloads, the refusals' messages, a pure-numpy model of
the order, and the number of device algorithm calls per op.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.onebit import onebit_columns
from horovod_gradcomp.native import require_native, require_twin

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# One-column sizes around the lanes (16) and the blocks (128 rows: 2048 values); matrices around
# the row blocks; ResNet-like shapes.
SHAPES = [(0,), (1,), (15,), (16,), (17,), (2047,), (2048,), (2049,), (3 * 2048 + 5,), ((1 << 20) + 3,), (5, 7),
          (127, 9), (128, 8), (129, 3), (300, 33), (64, 3, 7, 7), (256, 64, 1, 1), (1000, 2048)]
# (shape, window widths): the widths of the two-phase exchange's column stripes.
WINDOW_SHAPES = [(64, 3, 7, 7), (256, 128, 3, 3), (1000, 2048), (3, 300), (0, 10)]
WIDTHS = [2, 7, 8, 9, 296]


def _ids(x):
    return str(x).replace("torch.", "") if isinstance(x, torch.dtype) else "x".join(map(str, x)) or "scalar"


@pytest.fixture(scope="module")
def tw():
    return require_twin()  # raises, naming why, when _C_twin is missing: never a skip


@pytest.fixture(scope="module")
def cpu():
    return require_native()


def _grad(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.7).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    ab, bb = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    if not torch.equal(ab, bb):
        diff = (ab != bb).nonzero()
        raise AssertionError(f"{what}: bytes differ ({diff.numel()} of {ab.numel()}, first at byte {int(diff[0])})")


def _encode(mod, g, r, cols):
    """(bits, scales, residual after) of mod's onebit_encode; r: the residual before or None."""
    res = None if r is None else r.clone().reshape(-1)
    bits, scales = mod.onebit_encode(g.reshape(-1), res, cols)
    return bits, scales, res


class _Threads:
    """torch.set_num_threads for a block (the twin's OpenMP runtime is torch's libgomp: one
    process-wide setting, checked in test_twin_shares_torchs_thread_setting)."""

    def __init__(self, n):
        self.n, self.old = n, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


# ---- encode, decode, decode-sum -------------------------------------------------------------


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_encode_equals_cpu(tw, cpu, shape, dtype, residual):
    g = _grad(shape, dtype)
    r = _grad(shape, dtype, seed=1) * 0.3 if residual else None
    cols = onebit_columns(shape)
    want = _encode(cpu, g, r, cols)
    got = _encode(tw, g, r, cols)
    for name, a, b in zip(("bits", "scales", "residual"), got, want):
        if b is not None:
            _same(a, b, f"{name} of {shape} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_decode_equals_cpu(tw, cpu, shape, dtype):
    g = _grad(shape, dtype, seed=2)
    cols = onebit_columns(shape)
    n = g.numel()
    bits, scales = cpu.onebit_encode(g.reshape(-1), None, cols)
    want = cpu.onebit_decode(bits, scales, n, cols, dtype)
    _same(tw.onebit_decode(bits, scales, n, cols, dtype), want, f"decode of {shape} {dtype}")
    out = torch.full((n,), 7.0, dtype=dtype)
    assert tw.onebit_decode(bits, scales, n, cols, dtype, out) is not None
    _same(out, want, f"decode into out of {shape} {dtype}")


@pytest.mark.parametrize("K", range(1, 9))
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", [(2049,), (33, 9), (300, 33)], ids=_ids)
def test_decode_sum_equals_cpu(tw, cpu, shape, dtype, K):
    cols, n = onebit_columns(shape), math.prod(shape)
    payloads = [cpu.onebit_encode(_grad(shape, dtype, seed=10 + k).reshape(-1), None, cols) for k in range(K)]
    # strided rows of one receive buffer (row stride above the length), as the exchange stacks them
    nb = (n + 7) // 8
    bits = torch.zeros(K, nb + 5, dtype=torch.uint8)
    scales = torch.zeros(K, 2 * cols + 3)
    for k, (b, s) in enumerate(payloads):
        bits[k, :nb] = b
        scales[k, :2 * cols] = s
    bits, scales = bits[:, :nb], scales[:, :2 * cols]
    for scale in (1.0 / K, 0.37, 1.0):
        want = cpu.onebit_decode_sum(bits, scales, n, cols, dtype, scale)
        _same(tw.onebit_decode_sum(bits, scales, n, cols, dtype, scale), want, f"K={K} scale={scale}")


# ---- column windows --------------------------------------------------------------------------


def _windows(cols):
    for width in WIDTHS:
        if width <= cols:
            for start in sorted({0, (cols - width) // 2, cols - width}):  # first, middle, last
                yield start, start + width


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", WINDOW_SHAPES, ids=_ids)
def test_column_windows_equal_cpu(tw, cpu, shape, dtype, residual):
    g = _grad(shape, dtype, seed=3)
    cols = onebit_columns(shape)
    windows = list(_windows(cols))
    assert windows
    for c0, c1 in windows:
        r_cpu = _grad(shape, dtype, seed=4) * 0.3 if residual else None
        r_tw = None if r_cpu is None else r_cpu.clone()
        r_copy = None if r_cpu is None else r_cpu.reshape(shape[0], cols)[:, c0:c1].contiguous()
        want = cpu.onebit_encode_columns(g, r_cpu, cols, c0, c1)
        got = tw.onebit_encode_columns(g, r_tw, cols, c0, c1)
        what = f"window [{c0}, {c1}) of {shape} {dtype}"
        _same(got[0], want[0], f"bits of {what}")
        _same(got[1], want[1], f"scales of {what}")
        if residual:
            _same(r_tw, r_cpu, f"residual (whole tensor) of {what}")
        # the promise of both: the encode of the window's contiguous copy
        copy = g.reshape(shape[0], cols)[:, c0:c1].contiguous()
        ref = _encode(tw, copy, r_copy, c1 - c0)
        _same(got[0], ref[0], f"bits of {what} vs its contiguous copy")
        _same(got[1], ref[1], f"scales of {what} vs its contiguous copy")
        if residual:
            _same(r_tw.reshape(shape[0], cols)[:, c0:c1].contiguous(), ref[2].view(-1, c1 - c0),
                  f"residual of {what} vs its contiguous copy")
        # decode into the window of a full tensor: the other columns untouched
        out_cpu = _grad(shape, dtype, seed=5)
        out_tw = out_cpu.clone()
        cpu.onebit_decode_columns(want[0], want[1], out_cpu, cols, c0, c1)
        assert tw.onebit_decode_columns(want[0], want[1], out_tw, cols, c0, c1) is None
        _same(out_tw, out_cpu, f"decode into {what}")


def test_column_window_refusals_match_cpu(tw, cpu):
    g = _grad((6, 10), torch.float32)
    bits, scales = cpu.onebit_encode_columns(g, None, 10, 2, 5)
    cases = [
        ("onebit_encode_columns", (g, None, 10, 4, 5)),              # one column
        ("onebit_encode_columns", (g, None, 10, 8, 11)),             # past the end
        ("onebit_encode_columns", (g, None, 7, 0, 2)),               # columns do not split
        ("onebit_encode_columns", (g.t(), None, 10, 0, 2)),          # not contiguous
        ("onebit_encode_columns", (g, torch.zeros(59), 10, 0, 2)),   # residual size
        ("onebit_encode_columns", (g.int(), None, 10, 0, 2)),        # dtype
        ("onebit_decode_columns", (bits, scales, torch.zeros(10, 6).t(), 10, 2, 5)),  # out not contiguous
        ("onebit_decode_columns", (bits, scales, torch.zeros(60), 10, 2, 3)),          # one column
        ("onebit_decode_columns", (bits[None], scales, torch.zeros(60), 10, 2, 5)),    # stacked bits
        ("onebit_decode_columns", (bits[:-1], scales, torch.zeros(60), 10, 2, 5)),     # truncated bits
        ("onebit_decode_columns", (bits, scales[:-1], torch.zeros(60), 10, 2, 5)),     # missing scales
        ("onebit_decode_columns", (bits, scales.double(), torch.zeros(60), 10, 2, 5)),  # scales dtype
        ("onebit_decode_columns", (bits, scales, torch.zeros(60, dtype=torch.int32), 10, 2, 5)),  # out dtype
    ]
    for op, args in cases:
        with pytest.raises(RuntimeError) as want:
            getattr(cpu, op)(*args)
        with pytest.raises(RuntimeError) as got:
            getattr(tw, op)(*args)
        assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0], op


def test_codec_twin_uses_column_windows(tw):
    codec, native = hgc.get_codec("onebit", impl="twin", scales="columns"), hgc.get_codec("onebit", scales="columns")
    g = _grad((300, 33), torch.float32, seed=6)
    assert codec.encodes_column_windows(g, 9) and native.encodes_column_windows(g, 9)
    assert not hgc.get_codec("onebit", impl="reference", scales="columns").encodes_column_windows(g, 9)
    assert not hgc.get_codec("onebit", impl="twin").encodes_column_windows(g, 9)  # rows mode: no column windows
    r1, r2 = torch.zeros_like(g), torch.zeros_like(g)
    p_tw, p_cpu = codec.encode_columns(g, r1, 9, 18), native.encode_columns(g, r2, 9, 18)
    for name in p_cpu.buffers:
        _same(p_tw.buffers[name], p_cpu.buffers[name], name)
    _same(r1, r2, "residual")
    out1, out2 = torch.zeros_like(g), torch.zeros_like(g)
    codec.decode_columns(p_tw, out1, 9)
    native.decode_columns(p_cpu, out2, 9)
    _same(out1, out2, "decode_columns")


# ---- one order at any thread count -----------------------------------------------------------


def test_twin_shares_torchs_thread_setting(tw):
    """The twin's OpenMP runtime is the libgomp torch loaded (one soname), so set_num_threads
    below reaches the twin's Thrust calls."""
    gomp = ctypes.CDLL("libgomp.so.1")
    for n in (1, 3):
        with _Threads(n):
            assert gomp.omp_get_max_threads() == n


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_payload_same_at_1_2_4_threads(tw, cpu, dtype):
    cases = [((1 << 20) + 3,), (2048, 1000)]
    for shape in cases:
        g = _grad(shape, dtype, seed=7)
        r = _grad(shape, dtype, seed=8) * 0.3
        cols = onebit_columns(shape)
        runs = {}
        for threads in (1, 2, 4):
            with _Threads(threads):
                for name, mod in (("cpu", cpu), ("twin", tw)):
                    runs[name, threads] = _encode(mod, g, r, cols)
                    r_win = r.clone()
                    if len(shape) == 2:
                        runs[name + "-window", threads] = mod.onebit_encode_columns(g, r_win, cols, 100, 396) + (r_win,)
        for (name, threads), got in runs.items():
            ref = runs[name.replace("twin", "cpu"), 1]
            for what, a, b in zip(("bits", "scales", "residual"), got, ref):
                _same(a, b, f"{what} of {shape} {dtype}, {name} at {threads} threads")


# ---- the order itself ------------------------------------------------------------------------


def _model_scales(v: np.ndarray, cols: int) -> np.ndarray:
    """onebit_functors.h's order in numpy (fp32 values): float32 block sums in row order, blocks
    added in float64 in block order; one column as 16 lanes added in lane order."""
    one_col = cols == 1
    n = v.size
    c = 16 if one_col else cols
    rows = -(-n // c)
    m = np.zeros(rows * c, np.float32)
    m[:n] = v
    valid = np.zeros(rows * c, bool)
    valid[:n] = True
    m, valid = m.reshape(rows, c), valid.reshape(rows, c)
    tot = np.zeros((3, c))
    for b0 in range(0, rows, 128):
        s = np.zeros((3, c), np.float32)
        for row in range(b0, min(rows, b0 + 128)):
            x, ok = m[row], valid[row]
            nonneg = (x >= 0) & ok
            s[0] += np.where(nonneg, x, np.float32(0))
            s[1] += np.where(~nonneg & ok, x, np.float32(0))
            s[2] += nonneg.astype(np.float32)
        tot += s.astype(np.float64)
    if one_col:
        tot = np.array([[sum(t.tolist(), 0.0)] for t in tot])  # lane order, from 0.0
    count = n if one_col else rows
    with np.errstate(divide="ignore", invalid="ignore"):
        a_pos = np.where(tot[2] > 0, tot[0] / tot[2], 0.0)
        a_neg = np.where(count - tot[2] > 0, tot[1] / (count - tot[2]), 0.0)
    return np.concatenate([a_pos, a_neg]).astype(np.float32)


@pytest.mark.parametrize("shape", [(2049,), (5 * 2048 + 77,), (300, 33), (129, 3), (1000, 20)], ids=_ids)
def test_scales_follow_the_documented_order(tw, cpu, shape):
    g = _grad(shape, torch.float32, seed=11)
    cols = onebit_columns(shape)
    want = torch.from_numpy(_model_scales(g.reshape(-1).numpy(), cols))
    for name, mod in (("cpu", cpu), ("twin", tw)):
        _same(mod.onebit_encode(g.reshape(-1), None, cols)[1], want, f"{name} scales of {shape} vs the numpy model")


# ---- device algorithm calls ------------------------------------------------------------------


def _calls(tw, fn):
    before = tw.algorithm_calls()
    fn()
    return tw.algorithm_calls() - before


def test_algorithm_calls_per_op_do_not_grow_with_the_size(tw):
    for shape, want in (((300, 33), 3), ((4000, 500), 3), ((2049,), 4), (((1 << 21) + 1,), 4), ((0,), 0)):
        g = _grad(shape, torch.float32)
        cols = onebit_columns(shape)
        r = torch.zeros_like(g).reshape(-1)
        assert _calls(tw, lambda: tw.onebit_encode(g.reshape(-1), r, cols)) == want, shape
        if len(shape) == 2:
            assert _calls(tw, lambda: tw.onebit_encode_columns(g, None, cols, 1, 9)) == want, shape
        bits, scales = tw.onebit_encode(g.reshape(-1), None, cols)
        n = g.numel()
        stacked_b, stacked_s = bits.expand(8, -1), scales.expand(8, -1)
        assert _calls(tw, lambda: tw.onebit_decode_sum(stacked_b, stacked_s, n, cols, torch.float32, 0.125)) == (
            1 if n else 0), shape
        if len(shape) == 2:
            out = torch.zeros_like(g)
            assert _calls(tw, lambda: tw.onebit_decode_columns(bits[:(shape[0] * 8 + 7) // 8], scales[:16], out,
                                                               cols, 3, 11)) == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_encode_sign_edge_values_equal_cpu(tw, cpu, dtype):
    """-0.0 counts as non-negative, subnormals, infinities and NaN (negative side): the same bytes
    on the twin (x86 on both sides; a GPU's NaN bit patterns are not specified to match: the
    exchange's non-finite check decides before a NaN payload matters)."""
    info = torch.finfo(dtype)
    specials = torch.tensor([0.0, -0.0, info.tiny / 4, -info.tiny / 4, info.max, -info.max], dtype=torch.float64)
    for extra, name in (([], "finite"), ([math.inf, -math.inf], "inf"), ([math.nan], "nan")):
        vals = torch.cat([specials, torch.tensor(extra, dtype=torch.float64)]).to(dtype)
        g = _grad((300, 24), dtype, seed=12).reshape(-1)
        g[torch.arange(vals.numel()) * 331 % g.numel()] = vals
        for shape, cols in (((300, 24), 24), ((7200,), 1)):
            r = _grad((7200,), dtype, seed=13) * 0.1
            want, got = _encode(cpu, g, r, cols), _encode(tw, g, r, cols)
            for what, a, b in zip(("bits", "scales", "residual"), got, want):
                _same(a, b, f"{what} of {shape} {dtype} with {name} values")
