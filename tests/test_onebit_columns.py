"""onebit's column windows: encoding and decoding columns [start, stop) of a tensor in place.

The two-phase exchange encodes onebit's column stripes this way instead of copying them. The
oracle is the codec's own contiguous path on an explicit copy of the window (itself tested
against numpy in test_onebit_codec.py): the window must give the same bytes, the same residual
window, and leave everything outside the window untouched.
"""
from __future__ import annotations

import math

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.stripes import balanced_ranges

pytestmark = pytest.mark.timeout(120)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# (shape, windows): widths odd and multiple-of-8, first / middle / last columns, the whole row.
CASES = [
    ((1, 2), [(0, 2)]),
    ((7, 9), [(0, 2), (3, 8), (7, 9), (0, 9)]),
    ((5, 16), [(0, 8), (8, 16), (3, 11), (1, 16)]),
    ((3, 24), [(8, 16), (3, 19), (0, 24)]),
    ((0, 6), [(0, 3)]),
    ((33, 8 * 37 + 1), balanced_ranges(8 * 37 + 1, 3) + [(5, 8 * 20 + 5)]),
    ((4, 3, 5, 5), balanced_ranges(75, 4)),
    ((64, 3, 3, 3), balanced_ranges(27, 2) + balanced_ranges(27, 4)),
]
IDS = ["x".join(map(str, s)) for s, _ in CASES]


def _matrix(t):
    return t.view(t.shape[0], math.prod(t.shape[1:]))


def _grad(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) + 0.05).to(dtype)


@pytest.fixture
def codec():
    return hgc.get_codec("onebit", impl="native", scales="columns")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,windows", CASES, ids=IDS)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_encode_window_is_the_encode_of_a_copy(codec, shape, windows, dtype, with_residual):
    for w, (start, stop) in enumerate(windows):
        g = _grad(shape, dtype, seed=w)
        g_before = g.clone()
        r = _grad(shape, dtype, seed=100 + w) * 0.1 if with_residual else None
        r_copy = None if r is None else _matrix(r)[:, start:stop].clone(memory_format=torch.contiguous_format)
        r_before = None if r is None else r.clone()

        want = codec.encode(_matrix(g)[:, start:stop].contiguous(), residual=r_copy)
        got = codec.encode_columns(g, r, start, stop)

        assert tuple(got.shape) == (shape[0], stop - start) and got.dtype == dtype
        assert torch.equal(got.buffers["bits"], want.buffers["bits"]), f"bits differ, window {start}:{stop}"
        assert torch.equal(got.buffers["scales"], want.buffers["scales"]), f"scales differ, window {start}:{stop}"
        assert torch.equal(g, g_before), "the gradient must not change"
        if r is not None:
            assert torch.equal(_matrix(r)[:, start:stop], r_copy), "residual window differs from the copy's"
            outside = torch.ones(_matrix(r).shape, dtype=torch.bool)
            outside[:, start:stop] = False
            assert torch.equal(_matrix(r)[outside], _matrix(r_before)[outside]), "residual changed outside the window"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,windows", CASES, ids=IDS)
def test_decode_window_writes_the_window_only(codec, shape, windows, dtype):
    for w, (start, stop) in enumerate(windows):
        g = _grad(shape, dtype, seed=w)
        payload = codec.encode(_matrix(g)[:, start:stop].contiguous())
        out = torch.full(shape, 7.0, dtype=dtype)
        codec.decode_columns(payload, out, start)
        assert torch.equal(_matrix(out)[:, start:stop], _matrix(codec.decode(payload)))
        outside = torch.ones(_matrix(out).shape, dtype=torch.bool)
        outside[:, start:stop] = False
        assert bool((_matrix(out)[outside] == 7.0).all()), "decode wrote outside the window"


def test_window_roundtrip_puts_the_scales_in_place(codec):
    """Decoded window = a+_j where the value was >= 0, a-_j elsewhere, with a+_j / a-_j the
    column means computed here independently."""
    g = _grad((40, 12), torch.float64, seed=3)
    start, stop = 2, 9
    payload = codec.encode_columns(g, None, start, stop)
    out = torch.zeros_like(g)
    codec.decode_columns(payload, out, start)
    window = g[:, start:stop]
    pos = window >= 0
    a_pos = torch.where(pos, window, 0).sum(0) / pos.sum(0).clamp(min=1)
    a_neg = torch.where(pos, 0, window).sum(0) / (~pos).sum(0).clamp(min=1)
    want = torch.where(pos, a_pos.float().double(), a_neg.float().double())
    torch.testing.assert_close(out[:, start:stop], want, rtol=0, atol=1e-6)


def test_which_tensors_have_windows(codec):
    g = torch.zeros(4, 6)
    assert codec.encodes_column_windows(g, 2)
    assert not codec.encodes_column_windows(g, 1), "one column has its own contiguous path"
    assert not codec.encodes_column_windows(torch.zeros(24), 2), "1-D tensors are one column"
    assert not codec.encodes_column_windows(torch.zeros(6, 4).t(), 2), "not contiguous"
    assert not hgc.get_codec("onebit", impl="reference", scales="columns").encodes_column_windows(g, 2)
    assert not hgc.get_codec("terngrad").encodes_column_windows(g, 2), "the base class has none"


@pytest.mark.parametrize("start,stop", [(0, 1), (3, 3), (-1, 2), (5, 7), (4, 2)])
def test_bad_windows_are_refused(codec, start, stop):
    g = torch.zeros(4, 6)
    with pytest.raises(ValueError, match="column-window"):
        codec.encode_columns(g, None, start, stop)
    payload = codec.encode(torch.zeros(4, max(stop - start, 1)))
    with pytest.raises((ValueError, RuntimeError), match="column"):
        codec.decode_columns(payload, torch.zeros(4, 6), start)


def test_native_kernel_checks_the_window_itself(codec):
    """The binding refuses what the Python side would never pass (a caller of _C directly)."""
    g = torch.zeros(4, 6)
    with pytest.raises(RuntimeError, match="must hold at least 2"):
        codec._C.onebit_encode_columns(g, None, 6, 5, 7)
    with pytest.raises(RuntimeError, match="do not split"):
        codec._C.onebit_encode_columns(g, None, 5, 0, 2)


def test_decode_refuses_a_payload_of_another_height(codec):
    payload = codec.encode(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="does not fit"):
        codec.decode_columns(payload, torch.zeros(4, 6), 0)
    assert math.prod(payload.shape) == 12
