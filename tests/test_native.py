"""The native extension horovod_gradcomp._C against the pure-torch reference of onebit.

On the machines these tests run on the extension must be there: a missing extension is a
failure (with the reason it did not load), never a skip.
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.codecs.onebit import onebit_columns

pytestmark = pytest.mark.timeout(120)

# Big enough (> 2 * 32768 values) for the native kernels to split the work across threads
# and to walk the output in several blocks; (66, 1032) also has several column blocks.
LARGE_SHAPES = [(70001,), (520, 136), (300, 233), (129, 64, 3, 3), (66, 1032)]

# native vs reference on the same input: summation order differs, nothing else.
SCALE_TOL = dict(rtol=1e-5, atol=1e-6)
RESIDUAL_TOL = {
    torch.float16: dict(rtol=2e-3, atol=1e-5),    # 1 ulp of fp16 where the scales differ in the last bits
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-5, atol=1e-6),    # scales are float32 in both
}


def _dtype_id(d):
    return str(d).replace("torch.", "")


def _shape_id(s):
    return "x".join(map(str, s))


def codecs():
    """onebit's native and reference codecs in columns mode (rows mode: tests/test_onebit_rows.py)."""
    native = hgc.get_codec("onebit", impl="native", scales="columns")
    reference = hgc.get_codec("onebit", impl="reference", scales="columns")
    return native, reference


# -- the extension is there --------------------------------------------------------------

def test_native_extension_is_available():
    assert hgc.native_available(), (
        f"horovod_gradcomp._C did not load: {hgc.native_error()} "
        "(build it with `.venv/bin/python setup.py -q build_ext --inplace`)")
    assert hgc.native_error() is None
    assert hgc.get_codec("onebit").impl == "native"  # native is the default


def test_native_has_cuda_kernels_where_cuda_is(device):
    assert hgc.native_available(), f"horovod_gradcomp._C did not load: {hgc.native_error()}"
    if device.type == "cuda":
        assert hgc.native_has_cuda(), "torch has CUDA but horovod_gradcomp._C was built without its CUDA kernels"
    else:
        assert isinstance(hgc.native_has_cuda(), bool)


# -- encode: native == reference -----------------------------------------------------------

def _check_encode_matches(shape, dtype, device, make_grad, with_residual, seed=0):
    native, reference = codecs()
    g = make_grad(shape, dtype, device, seed=seed)
    g_before = g.clone()
    r0 = make_grad(shape, dtype, device, seed=seed + 1000, scale=0.3) if with_residual else None
    r_nat = r0.clone() if with_residual else None
    r_ref = r0.clone() if with_residual else None
    p_nat = native.encode(g, residual=r_nat)
    p_ref = reference.encode(g, residual=r_ref)
    assert torch.equal(g, g_before), "encode changed the gradient"

    n, cols = g.numel(), onebit_columns(shape)
    for p in (p_nat, p_ref):
        assert list(p.buffers) == ["bits", "scales"]
        assert p.buffers["bits"].dtype == torch.uint8 and p.buffers["bits"].shape == ((n + 7) // 8,)
        assert p.buffers["scales"].dtype == torch.float32 and p.buffers["scales"].shape == (2 * cols,)
        assert p.buffers["bits"].device == g.device and p.buffers["scales"].device == g.device
        assert p.shape == g.shape and p.dtype == dtype and p.device == g.device

    assert torch.equal(p_nat.buffers["bits"], p_ref.buffers["bits"]), "native and reference bits differ"
    torch.testing.assert_close(p_nat.buffers["scales"], p_ref.buffers["scales"], **SCALE_TOL)
    if with_residual:
        assert r_nat.dtype == dtype and r_nat.shape == g.shape
        torch.testing.assert_close(r_nat, r_ref, **RESIDUAL_TOL[dtype])
    return p_nat, p_ref


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_encode_matches_reference(shape, dtype, device, make_grad, with_residual):
    _check_encode_matches(shape, dtype, device, make_grad, with_residual)


@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_encode_matches_reference_multithreaded(shape, dtype, device, make_grad, with_residual):
    _check_encode_matches(shape, dtype, device, make_grad, with_residual, seed=7)


@pytest.mark.parametrize("shape", [(64,), (300, 24), (37, 5)], ids=_shape_id)
def test_encode_matches_reference_with_sign_edge_values(shape, dtype, device):
    """Zeros, -0.0 and values whose sign the residual flips: the bits must agree exactly."""
    native, reference = codecs()
    gen = torch.Generator().manual_seed(3)
    g = torch.randint(-2, 3, shape, generator=gen).to(torch.float64) * 0.5
    g.view(-1)[::5] = -0.0
    r = -g.clone()                               # v = 0 exactly
    r.view(-1)[::3] = 0.25 * torch.sign(torch.randn(r.view(-1)[::3].shape, generator=gen, dtype=torch.float64))
    g, r = g.to(dtype).to(device), r.to(dtype).to(device)
    r_nat, r_ref = r.clone(), r.clone()
    p_nat, p_ref = native.encode(g, r_nat), reference.encode(g, r_ref)
    assert torch.equal(p_nat.buffers["bits"], p_ref.buffers["bits"])
    torch.testing.assert_close(p_nat.buffers["scales"], p_ref.buffers["scales"], **SCALE_TOL)
    torch.testing.assert_close(r_nat, r_ref, **RESIDUAL_TOL[dtype])


def test_encode_non_contiguous_gradient(dtype, device, make_grad):
    native, reference = codecs()
    base = make_grad((12, 9), dtype, device, seed=5)
    g = base.t()                                  # (9, 12), not contiguous
    assert not g.is_contiguous()
    for codec in (native, reference):
        r1, r2 = torch.zeros(g.shape, dtype=dtype, device=device), torch.zeros(g.shape, dtype=dtype, device=device)
        p1, p2 = codec.encode(g, r1), codec.encode(g.contiguous(), r2)
        assert torch.equal(p1.buffers["bits"], p2.buffers["bits"])
        assert torch.equal(p1.buffers["scales"], p2.buffers["scales"])
        assert torch.equal(r1, r2)


def test_encode_is_deterministic(dtype, device, make_grad):
    native, _ = codecs()
    for shape in LARGE_SHAPES[:2]:
        g = make_grad(shape, dtype, device, seed=11)
        r0 = make_grad(shape, dtype, device, seed=12, scale=0.1)
        r1, r2 = r0.clone(), r0.clone()
        p1, p2 = native.encode(g, r1), native.encode(g, r2)
        assert torch.equal(p1.buffers["bits"], p2.buffers["bits"])
        assert torch.equal(p1.buffers["scales"], p2.buffers["scales"])
        assert torch.equal(r1, r2)


def test_nan_encodes_as_negative_like_reference(dtype, device):
    native, reference = codecs()
    g = torch.tensor([[1.0, float("nan")], [float("nan"), -1.0], [2.0, 3.0]], dtype=dtype, device=device)
    p_nat, p_ref = native.encode(g), reference.encode(g)
    assert p_nat.buffers["bits"].tolist() == p_ref.buffers["bits"].tolist() == [0b110001]
    torch.testing.assert_close(p_nat.buffers["scales"], p_ref.buffers["scales"], equal_nan=True)
    s = p_nat.buffers["scales"].tolist()
    assert s[:2] == [1.5, 3.0]                    # a+ of each column: the NaN is not among them


# -- decode ---------------------------------------------------------------------------

def _check_decode_matches(shape, dtype, device, make_grad):
    native, reference = codecs()
    g = make_grad(shape, dtype, device, seed=2)
    payload = native.encode(g, torch.zeros_like(g))
    d_nat, d_ref = native.decode(payload), reference.decode(payload)
    for d in (d_nat, d_ref):
        assert d.shape == g.shape and d.dtype == dtype and d.device == g.device
    assert torch.equal(d_nat, d_ref)


def test_decode_matches_reference(shape, dtype, device, make_grad):
    _check_decode_matches(shape, dtype, device, make_grad)


@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=_shape_id)
def test_decode_matches_reference_multithreaded(shape, dtype, device, make_grad):
    _check_decode_matches(shape, dtype, device, make_grad)


def test_decode_ignores_pad_bits(dtype, device, make_grad):
    native, reference = codecs()
    for shape in [(7,), (8 * 37 + 1,), (5, 7)]:
        g = make_grad(shape, dtype, device, seed=4)
        payload = native.encode(g)
        dirty = payload.buffers["bits"].clone()
        dirty[-1] |= (0xFF << (g.numel() % 8)) & 0xFF
        dirty_payload = Payload({"bits": dirty, "scales": payload.buffers["scales"]}, payload.shape, dtype, g.device)
        for codec in (native, reference):
            assert torch.equal(codec.decode(dirty_payload), codec.decode(payload))


def test_decode_into_out(shape, dtype, device, make_grad):
    native, _ = codecs()
    g = make_grad(shape, dtype, device, seed=6)
    payload = native.encode(g)
    out = torch.full(g.shape, 12345.0, dtype=dtype, device=device)
    result = native.decode(payload, out=out)
    assert torch.equal(out, native.decode(payload))
    assert result.data_ptr() == out.data_ptr() and result.shape == out.shape and torch.equal(result, out)


def test_out_variants_return_the_given_tensor(device, make_grad):
    """``decode(out=o)`` / ``decode_mean_stacked(out=o)`` return ``o`` itself (the torch ``out=``
    convention, and what the reference implementation does)."""
    native, _ = codecs()
    g = make_grad((6, 5), torch.float32, device)
    payload = native.encode(g)
    stacked = Payload({k: v.unsqueeze(0) for k, v in payload.buffers.items()}, payload.shape, payload.dtype,
                      payload.device)
    out1, out2 = torch.empty_like(g), torch.empty_like(g)
    r1, r2 = native.decode(payload, out=out1), native.decode_mean_stacked(stacked, out=out2)
    assert torch.equal(out1, r1) and torch.equal(out2, r2)
    assert r1 is out1, "native decode(out=o) returned another tensor (a view of o), not o"
    assert r2 is out2, "native decode_mean_stacked(out=o) returned another tensor (a view of o), not o"


# -- decode_mean_stacked of K stacked payloads ------------------------------------------------------

def _mean_tolerance(dtype, decodes, scale=None):
    """rtol/atol for ``scale * sum`` of K payloads in ``dtype`` against the same computed in
    float64 from the individual decodes (``decodes``: [K, ...]): the result is rounded once to
    dtype, each decoded value once, and the kernels sum in float32."""
    if dtype == torch.float64:
        return dict(rtol=1e-12, atol=1e-12)
    k = decodes.shape[0]
    scale = 1.0 / k if scale is None else scale
    eps = torch.finfo(dtype).eps
    big = decodes.abs().max().item() if decodes.numel() else 0.0
    return dict(rtol=2 * eps, atol=2 * eps * big * max(1.0, scale * k) + 1e-7)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_decode_mean_matches_mean_of_decodes(shape, dtype, device, make_grad, stack_payloads, k):
    native, reference = codecs()
    payloads = [native.encode(make_grad(shape, dtype, device, seed=100 + i, shift=0.2 * i)) for i in range(k)]
    stacked = stack_payloads(payloads)
    assert stacked.buffers["bits"].shape == (k, (stacked.numel + 7) // 8)
    if device.type == "cpu" and k > 1 and stacked.buffers["scales"].numel():
        assert not stacked.buffers["scales"].is_contiguous()   # strided rows of the receive buffer

    decodes = torch.stack([reference.decode(p).double() for p in payloads])
    expected = decodes.mean(0)
    got = native.decode_mean_stacked(stacked)
    assert got.shape == torch.Size(shape) and got.dtype == dtype and got.device == device
    tol = _mean_tolerance(dtype, decodes)
    torch.testing.assert_close(got.double(), expected, **tol)
    torch.testing.assert_close(reference.decode_mean_stacked(stacked).double(), expected, **tol)

    # scale: the sum, and any other factor
    for scale in (1.0, 0.25):
        torch.testing.assert_close(native.decode_mean_stacked(stacked, scale=scale).double(), decodes.sum(0) * scale,
                                   **_mean_tolerance(dtype, decodes, scale))

    out = torch.full(shape, -7.0, dtype=dtype, device=device)
    result = native.decode_mean_stacked(stacked, out=out)
    assert result.data_ptr() == out.data_ptr() and result.shape == out.shape
    assert torch.equal(out, got)


@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=_shape_id)
def test_decode_mean_multithreaded(shape, dtype, device, make_grad, stack_payloads, k):
    native, reference = codecs()
    payloads = [native.encode(make_grad(shape, dtype, device, seed=200 + i)) for i in range(k)]
    stacked = stack_payloads(payloads)
    decodes = torch.stack([reference.decode(p).double() for p in payloads])   # independent of the kernels
    torch.testing.assert_close(native.decode_mean_stacked(stacked).double(), decodes.mean(0),
                               **_mean_tolerance(dtype, decodes))


# -- bad inputs: clear errors, no crash -------------------------------------------------------

@pytest.mark.parametrize("bad_dtype", [torch.int32, torch.int64, torch.uint8, torch.bool], ids=_dtype_id)
def test_integer_gradient_is_a_type_error(bad_dtype, device):
    native, _ = codecs()
    g = torch.ones(4, 3, dtype=bad_dtype, device=device)
    with pytest.raises(TypeError, match="fp16/bf16/fp32/fp64"):
        native.encode(g)
    with pytest.raises(TypeError):
        native.encode(g, residual=torch.zeros(4, 3, dtype=bad_dtype, device=device))


def test_residual_mismatch_is_a_value_error(dtype, device):
    native, _ = codecs()
    g = torch.randn(4, 6, dtype=torch.float64).to(dtype).to(device)
    other = torch.float32 if dtype != torch.float32 else torch.float64
    for r in (torch.zeros(6, 4, dtype=dtype, device=device),
              torch.zeros(24, dtype=dtype, device=device),
              torch.zeros(4, 6, 1, dtype=dtype, device=device),
              torch.zeros(4, 6, dtype=other, device=device)):
        with pytest.raises(ValueError, match="residual"):
            native.encode(g, residual=r)


def test_non_contiguous_residual_is_a_value_error(dtype, device):
    native, _ = codecs()
    g = torch.randn(4, 6, dtype=torch.float64).to(dtype).to(device)
    for r in (torch.zeros(6, 4, dtype=dtype, device=device).t(),
              torch.zeros(4, 12, dtype=dtype, device=device)[:, ::2]):
        assert r.shape == g.shape and not r.is_contiguous()
        with pytest.raises(ValueError, match="contiguous"):
            native.encode(g, residual=r)


def test_out_of_wrong_shape_dtype_or_layout_is_a_value_error(device, stack_payloads):
    native, _ = codecs()
    g = torch.randn(4, 6).to(device)
    payload = native.encode(g)
    stacked = stack_payloads([payload, payload])
    bad_outs = [torch.empty(6, 4, device=device), torch.empty(24, device=device),
                torch.empty(2, 4, 6, device=device), torch.empty(4, 6, dtype=torch.float64, device=device),
                torch.empty(6, 4, device=device).t()]
    for out in bad_outs:
        with pytest.raises(ValueError, match="out"):
            native.decode(payload, out=out)
        with pytest.raises(ValueError, match="out"):
            native.decode_mean_stacked(stacked, out=out)


def test_native_ops_reject_bad_buffers():
    native, _ = codecs()
    C = native._C
    g = torch.randn(5, 7)
    bits, scales = C.onebit_encode(g.reshape(-1), None, 7)
    assert bits.numel() == 5 and scales.numel() == 14
    with pytest.raises(RuntimeError, match="bytes of bits"):
        C.onebit_decode(bits[:4], scales, 35, 7, torch.float32)          # too-small bits buffer
    with pytest.raises(RuntimeError, match="bytes of bits"):
        C.onebit_decode_sum(bits[:4].unsqueeze(0).repeat(2, 1), scales.unsqueeze(0).repeat(2, 1), 35, 7,
                            torch.float32, 0.5)
    with pytest.raises(RuntimeError, match="scales"):
        C.onebit_decode(bits, scales[:12], 35, 7, torch.float32)         # too few scales
    with pytest.raises(RuntimeError):
        C.onebit_decode(bits, scales.double(), 35, 7, torch.float32)     # scales of the wrong dtype
    with pytest.raises(RuntimeError):
        C.onebit_decode(bits.to(torch.int8), scales, 35, 7, torch.float32)
    with pytest.raises(RuntimeError, match="columns"):
        C.onebit_encode(g.reshape(-1), None, 6)                          # 35 values, 6 columns
    with pytest.raises(RuntimeError):
        C.onebit_encode(g.reshape(-1), torch.zeros(34), 7)               # residual too small
    with pytest.raises(RuntimeError):
        C.onebit_encode(g.reshape(-1), torch.zeros(35, dtype=torch.float64), 7)
    with pytest.raises(RuntimeError, match="contiguous"):
        C.onebit_encode(torch.randn(70)[::2], None, 7)                   # non-contiguous gradient
    with pytest.raises(RuntimeError):
        C.onebit_encode(g.reshape(-1).to(torch.int32), None, 7)
    with pytest.raises(RuntimeError):
        C.onebit_decode_sum(bits.unsqueeze(0), scales.unsqueeze(0).repeat(2, 1), 35, 7, torch.float32, 0.5)
    with pytest.raises(RuntimeError):
        C.onebit_decode(bits, scales, 35, 7, torch.float32, torch.empty(34))   # out too small


def test_payload_with_truncated_bits_is_an_error_not_a_crash():
    native, _ = codecs()
    payload = native.encode(torch.randn(100))
    short = Payload({"bits": payload.buffers["bits"][:5], "scales": payload.buffers["scales"]}, payload.shape,
                    payload.dtype)
    with pytest.raises(RuntimeError, match="'bits' holds 5"):  # codecs.payload_checks, before the kernel
        native.decode(short)
    stacked = Payload({"bits": short.buffers["bits"].unsqueeze(0), "scales": short.buffers["scales"].unsqueeze(0)},
                      payload.shape, payload.dtype)
    with pytest.raises(RuntimeError, match="'bits' holds 5"):
        native.decode_mean_stacked(stacked)
