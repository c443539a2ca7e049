"""The onebit codec's contract in columns mode (the paper's grouping; rows mode, the default, is in
tests/test_onebit_rows.py), for both implementations (native and reference).

Expected values are computed independently here (numpy, hand-built bytes), never with the
library's own helpers.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload

pytestmark = pytest.mark.timeout(120)


def _shape_id(s):
    return "x".join(map(str, s)) if len(s) else "scalar"


def _columns(shape):
    return 1 if len(shape) <= 1 else math.prod(shape[1:])


def _np_bits(bits: torch.Tensor, n: int) -> np.ndarray:
    """Sign bits as bool[n], unpacked with numpy (LSB first)."""
    return np.unpackbits(bits.cpu().numpy(), bitorder="little")[:n].astype(bool)


def _np_grid(t: torch.Tensor) -> np.ndarray:
    cols = _columns(t.shape)
    return t.detach().cpu().double().numpy().reshape(-1, cols) if cols else np.zeros((0, 0))


# -- error feedback identity ----------------------------------------------------------------

def test_error_feedback_identity(shape, dtype, device, impl, make_grad, assert_feedback_identity):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad(shape, dtype, device, seed=1)
    r = make_grad(shape, dtype, device, seed=2, scale=0.5)
    r_old = r.clone()
    payload = codec.encode(g, residual=r)
    decoded = codec.decode(payload)
    assert decoded.shape == g.shape and decoded.dtype == dtype and decoded.device == g.device
    assert r.shape == g.shape and r.dtype == dtype and r.is_contiguous()
    assert_feedback_identity(g, r_old, decoded, r)


def test_error_feedback_identity_over_steps_float64(impl, device, make_grad):
    """T steps: sum of gradients == sum of what was sent + the final residual (float64)."""
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    shape = (16, 3, 3, 3)
    r = torch.zeros(shape, dtype=torch.float64, device=device)
    sent = torch.zeros_like(r)
    total = torch.zeros_like(r)
    for step in range(10):
        g = make_grad(shape, torch.float64, device, seed=50 + step, shift=0.1)
        total += g
        sent += codec.decode(codec.encode(g, residual=r))
    torch.testing.assert_close(sent + r, total, rtol=0, atol=1e-11)


def test_encode_without_residual_changes_nothing(shape, dtype, device, impl, make_grad):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad(shape, dtype, device, seed=3)
    before = g.clone()
    p1 = codec.encode(g)
    p2 = codec.encode(g, residual=None)
    assert torch.equal(g, before)
    assert torch.equal(p1.buffers["bits"], p2.buffers["bits"])
    assert torch.equal(p1.buffers["scales"], p2.buffers["scales"])
    # the same payload as with a zero residual, whose update is then the quantization error
    r = torch.zeros_like(g)
    p3 = codec.encode(g, residual=r)
    assert torch.equal(p1.buffers["bits"], p3.buffers["bits"])
    assert torch.equal(p1.buffers["scales"], p3.buffers["scales"])
    assert torch.equal(g, before)


def test_encode_with_residual_leaves_gradient_alone(dtype, device, impl, make_grad):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad((9, 13), dtype, device, seed=4)
    before = g.clone()
    codec.encode(g, residual=make_grad((9, 13), dtype, device, seed=5))
    assert torch.equal(g, before)


# -- payload size -------------------------------------------------------------------------

def test_payload_nbytes(shape, dtype, device, impl, make_grad):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad(shape, dtype, device, seed=6)
    payload = codec.encode(g)
    n, cols = math.prod(shape), _columns(shape)
    expected = -(-n // 8) + 8 * cols
    assert payload.nbytes == expected
    assert codec.payload_nbytes(shape, dtype) == expected
    assert codec.payload_nbytes(torch.Size(shape), dtype) == expected
    assert [(name, dt, numel) for name, dt, numel in codec.layout(shape, dtype)] == [
        ("bits", torch.uint8, -(-n // 8)), ("scales", torch.float32, 2 * cols)]
    assert {k: (v.dtype, v.numel()) for k, v in payload.buffers.items()} == {
        "bits": (torch.uint8, -(-n // 8)), "scales": (torch.float32, 2 * cols)}


# -- optimality of the reconstruction values ------------------------------------------------

def _column_sse(grid: np.ndarray, pos: np.ndarray, a_pos: np.ndarray, a_neg: np.ndarray) -> np.ndarray:
    rec = np.where(pos, a_pos[None, :], a_neg[None, :])
    return ((grid - rec) ** 2).sum(0)


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_scales_are_the_conditional_means(shape, dtype, device, impl, make_grad, with_residual):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad(shape, dtype, device, seed=7, shift=0.3)
    r = make_grad(shape, dtype, device, seed=8, scale=0.4) if with_residual else None
    v = g.double() + (r.double() if with_residual else 0)
    if dtype != torch.float64:
        v = v.float().double()                       # the kernels add g + r in float32
    payload = codec.encode(g, residual=r)
    n, cols = g.numel(), _columns(shape)
    grid = _np_grid(v)
    pos = _np_bits(payload.buffers["bits"], n).reshape(-1, cols) if cols else np.zeros((0, 0), bool)
    np.testing.assert_array_equal(pos, grid >= 0)
    scales = payload.buffers["scales"].cpu().double().numpy()
    a_pos, a_neg = scales[:cols], scales[cols:]

    # closed form, independently: mean of each side of each column, 0 for an empty side
    n_pos, n_neg = pos.sum(0), (~pos).sum(0)
    exp_pos = np.where(n_pos > 0, np.where(pos, grid, 0).sum(0) / np.maximum(n_pos, 1), 0.0)
    exp_neg = np.where(n_neg > 0, np.where(pos, 0, grid).sum(0) / np.maximum(n_neg, 1), 0.0)
    np.testing.assert_allclose(a_pos, exp_pos.astype(np.float32), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(a_neg, exp_neg.astype(np.float32), rtol=2e-6, atol=1e-7)
    assert (a_pos >= 0).all() and (a_neg <= 0).all()

    # minimality: moving a+_j or a-_j by +-eps raises column j's squared error (for fixed bits)
    base = _column_sse(grid, pos, a_pos, a_neg)
    eps = 1e-3
    for side, counts in ((0, n_pos), (1, n_neg)):
        for sign in (1.0, -1.0):
            ap, an = a_pos.copy(), a_neg.copy()
            (ap if side == 0 else an)[:] += sign * eps
            moved = _column_sse(grid, pos, ap, an)
            has = counts > 0
            assert (moved[has] > base[has]).all(), f"side {'+-'[side]}, shift {sign * eps}"
            np.testing.assert_allclose(moved[~has], base[~has], rtol=0, atol=0)


# -- bit layout --------------------------------------------------------------------------

HAND_VALUES = [1.0, -1.0, 0.0, -0.5, 2.0, 3.0, -2.0, -3.0, 0.5, -0.25]
#  bit:          1     0    1     0    1    1     0     0    1     0
#  byte 0 = 0b00110101 = 53 (element 0 in the least significant bit); byte 1 = 0b00000001 (pad bits 0)


def test_bit_layout_hand_built_1d(dtype, device, impl):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = torch.tensor(HAND_VALUES, dtype=dtype, device=device)
    payload = codec.encode(g)
    assert payload.buffers["bits"].cpu().tolist() == [0b00110101, 0b00000001]
    assert payload.buffers["scales"].cpu().tolist() == pytest.approx([6.5 / 5, -6.75 / 5], rel=1e-6)


def test_bit_layout_hand_built_2d(dtype, device, impl):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = torch.tensor([[1.0, -2.0, 3.0],
                      [-4.0, 5.0, 6.0],
                      [-0.0, -1.0, 0.5]], dtype=dtype, device=device)
    # row-major bits 1,0,1, 0,1,1, 1,0,1 (-0.0 >= 0): byte 0 = 0b01110101, byte 1 = 0b1
    payload = codec.encode(g)
    assert payload.buffers["bits"].cpu().tolist() == [0b01110101, 0b00000001]
    # a+ per column, then a- per column; column 2 has no negative entry -> a- = 0
    assert payload.buffers["scales"].cpu().tolist() == pytest.approx([0.5, 5.0, 9.5 / 3, -4.0, -1.5, 0.0])
    expected = torch.tensor([[0.5, -1.5, 9.5 / 3], [-4.0, 5.0, 9.5 / 3], [0.5, -1.5, 9.5 / 3]],
                            dtype=torch.float32).to(dtype)
    assert torch.equal(codec.decode(payload).cpu(), expected)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 8 * 37 + 1])
def test_pad_bits_are_zero(n, dtype, device, impl):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    bits = codec.encode(torch.ones(n, dtype=dtype, device=device)).buffers["bits"].cpu().tolist()
    assert bits == [0xFF] * (n // 8) + ([(1 << (n % 8)) - 1] if n % 8 else [])
    bits = codec.encode(-torch.ones(n, dtype=dtype, device=device)).buffers["bits"].cpu().tolist()
    assert bits == [0] * (-(-n // 8))


@pytest.mark.parametrize("shape", [(7,), (8 * 37 + 1,), (5, 7), (6, 24), (16, 3, 3, 3)], ids=_shape_id)
def test_bits_match_numpy_packbits(shape, dtype, device, impl, make_grad):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad(shape, dtype, device, seed=9)
    expected = np.packbits(g.cpu().double().numpy().reshape(-1) >= 0, bitorder="little")
    np.testing.assert_array_equal(codec.encode(g).buffers["bits"].cpu().numpy(), expected)


def test_nan_is_encoded_as_negative(dtype, device, impl):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    nan = float("nan")
    g = torch.tensor([1.0, nan, -1.0, 2.0], dtype=dtype, device=device)
    assert codec.encode(g).buffers["bits"].cpu().tolist() == [0b1001]
    # columns: a NaN in column 0 leaves column 1's values alone
    g = torch.tensor([[nan, 1.0], [2.0, -1.0], [4.0, -3.0]], dtype=dtype, device=device)
    payload = codec.encode(g)
    assert payload.buffers["bits"].cpu().tolist() == [0b010110]
    a = payload.buffers["scales"].cpu().tolist()
    assert a[0] == 3.0 and a[1] == 1.0 and math.isnan(a[2]) and a[3] == -2.0


def test_all_positive_and_all_negative_columns(dtype, device, impl):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = torch.tensor([[1.0, -1.0, 0.0, 2.0],
                      [3.0, -2.0, 0.0, -2.0],
                      [2.0, -6.0, 0.0, 4.0]], dtype=dtype, device=device)
    r = torch.zeros_like(g)
    payload = codec.encode(g, residual=r)
    # a+: [2, 0 (empty), 0 (all zeros: non-negative), 3]; a-: [0 (empty), -3, 0 (empty), -2]
    assert payload.buffers["scales"].cpu().tolist() == [2.0, 0.0, 0.0, 3.0, 0.0, -3.0, 0.0, -2.0]
    expected = torch.tensor([[2.0, -3.0, 0.0, 3.0], [2.0, -3.0, 0.0, -2.0], [2.0, -3.0, 0.0, 3.0]], dtype=dtype)
    assert torch.equal(codec.decode(payload).cpu(), expected)
    assert torch.equal(r.cpu(), (g.cpu().double() - expected.double()).to(dtype))


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
@pytest.mark.parametrize("shape", [(1,), (7,), (8 * 37 + 1,), (13, 1), (5, 8), (4, 3, 2)], ids=_shape_id)
def test_one_sided_tensor(shape, sign, dtype, device, impl, make_grad):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = (make_grad(shape, torch.float64, device, seed=10).abs() + 0.1).mul(sign).to(dtype)
    payload = codec.encode(g)
    cols = _columns(shape)
    scales = payload.buffers["scales"].cpu()
    empty = scales[cols:] if sign > 0 else scales[:cols]
    full = scales[:cols] if sign > 0 else scales[cols:]
    assert torch.equal(empty, torch.zeros(cols))
    exp = g.cpu().double().reshape(-1, cols).mean(0).float()
    torch.testing.assert_close(full, exp, rtol=2e-6, atol=0)


# -- decode -----------------------------------------------------------------------------

def test_decode_shape_dtype_device(shape, dtype, device, impl, make_grad):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad(shape, dtype, device, seed=11)
    payload = codec.encode(g)
    d = codec.decode(payload)
    assert d.shape == g.shape and d.dtype == g.dtype and d.device == g.device and d.is_contiguous()
    # each value is its column's a+ or a- (rounded to dtype), picked by its bit
    n, cols = g.numel(), _columns(shape)
    if n:
        scales = payload.buffers["scales"].cpu().double().numpy()
        pos = _np_bits(payload.buffers["bits"], n).reshape(-1, cols)
        expected = np.where(pos, scales[None, :cols], scales[None, cols:]).reshape(shape)
        expected = torch.from_numpy(expected).float().to(dtype)
        assert torch.equal(d.cpu(), expected)


def test_decode_into_out(shape, dtype, device, impl, make_grad):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    g = make_grad(shape, dtype, device, seed=12)
    payload = codec.encode(g)
    out = torch.full(shape, 99.0, dtype=dtype, device=device)
    result = codec.decode(payload, out=out)
    assert torch.equal(out, codec.decode(payload))
    assert result.data_ptr() == out.data_ptr() and result.shape == out.shape


BAD_OUTS = {
    "broadcast_target": lambda dev: torch.empty(2, 4, 6, device=dev),
    "flat": lambda dev: torch.empty(24, device=dev),
    "transposed_shape": lambda dev: torch.empty(6, 4, device=dev),
    "float64": lambda dev: torch.empty(4, 6, dtype=torch.float64, device=dev),
    "non_contiguous": lambda dev: torch.empty(6, 4, device=dev).t(),
}


@pytest.mark.parametrize("bad_out", list(BAD_OUTS))
def test_decode_out_must_match(device, impl, bad_out):
    """``out`` must be a contiguous tensor of the payload's shape and dtype (no broadcasting,
    no silent cast), whichever the implementation; a clear ValueError otherwise."""
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    payload = codec.encode(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).to(device))
    stacked = Payload({k: v.unsqueeze(0).expand(2, -1) for k, v in payload.buffers.items()}, payload.shape,
                      payload.dtype, payload.device)
    with pytest.raises(ValueError, match="out"):
        codec.decode(payload, out=BAD_OUTS[bad_out](device))
    with pytest.raises(ValueError, match="out"):
        codec.decode_mean_stacked(stacked, out=BAD_OUTS[bad_out](device))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(1,), (8 * 37 + 1,), (5, 7), (6, 24), (4, 0, 3, 3), (8, 16, 1, 1)], ids=_shape_id)
def test_decode_mean(shape, k, dtype, device, impl, make_grad, stack_payloads):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    payloads = [codec.encode(make_grad(shape, dtype, device, seed=20 + i, shift=0.1 * i)) for i in range(k)]
    stacked = stack_payloads(payloads)
    decodes = torch.stack([codec.decode(p).double() for p in payloads])
    got = codec.decode_mean_stacked(stacked)
    assert got.shape == torch.Size(shape) and got.dtype == dtype and got.device == device
    if dtype == torch.float64:
        tol = dict(rtol=1e-12, atol=1e-12)
    else:
        eps = torch.finfo(dtype).eps
        tol = dict(rtol=2 * eps, atol=2 * eps * (decodes.abs().max().item() if decodes.numel() else 0) + 1e-7)
    torch.testing.assert_close(got.double(), decodes.mean(0), **tol)
    out = torch.empty(shape, dtype=dtype, device=device)
    result = codec.decode_mean_stacked(stacked, out=out)
    assert result.data_ptr() == out.data_ptr() and torch.equal(out, got)


# -- registry -----------------------------------------------------------------------------

def test_unknown_codec_lists_available():
    assert "onebit" in hgc.available_codecs()
    with pytest.raises(ValueError) as info:
        hgc.get_codec("nope")
    msg = str(info.value)
    assert "nope" in msg
    for name in hgc.available_codecs():
        assert name in msg


def test_bad_impl_is_a_value_error():
    with pytest.raises(ValueError, match="impl"):
        hgc.get_codec("onebit", impl="bogus")


def test_get_codec_builds_the_asked_impl(impl):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    assert codec.name == "onebit" and codec.impl == impl and codec.fuses_feedback


# -- bad inputs, both implementations -----------------------------------------------------------

def test_bad_inputs(device, impl):
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    with pytest.raises(TypeError):
        codec.encode(torch.ones(4, 3, dtype=torch.int32, device=device))
    g = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)).to(device)
    with pytest.raises(ValueError, match="residual"):
        codec.encode(g, residual=torch.zeros(3, 4, device=device))
    with pytest.raises(ValueError, match="residual"):
        codec.encode(g, residual=torch.zeros(4, 3, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        codec.encode(g, residual=torch.zeros(3, 4, device=device).t())


def test_encode_of_an_expanded_gradient(device, impl):
    """A gradient with zero strides (expand) encodes like its materialized copy."""
    codec = hgc.get_codec("onebit", impl=impl, scales="columns")
    row = torch.tensor([1.0, -2.0, 3.0, -4.0, 0.5], device=device)
    g = row.expand(6, 5)
    p1, p2 = codec.encode(g), codec.encode(g.contiguous())
    assert torch.equal(p1.buffers["bits"], p2.buffers["bits"])
    assert torch.equal(p1.buffers["scales"], p2.buffers["scales"])


def test_stacked_payload_type():
    p = Payload({"bits": torch.zeros(3, 2, dtype=torch.uint8), "scales": torch.zeros(3, 2)}, torch.Size([9]),
                torch.float32)
    assert p.nbytes == 3 * 2 + 3 * 2 * 4 and p.numel == 9
