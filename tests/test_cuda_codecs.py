"""The native CUDA kernels against the native CPU kernels and the pure-torch references.

For every codec (onebit, TernGrad, QSGD fixed and Elias, DGC), dtype (fp16/bf16/fp32/fp64)
and size (0, 1, 7, 8k+1, the ResNet-50 shapes):

* the payload encoded on the GPU has the CPU's bytes (onebit: the CPU's bits and scales
  equal up to the order of the double sums inside a column);
* both wire directions: a GPU payload decodes on the CPU, a CPU payload decodes on the GPU,
  with identical values; decode-sum of K strided payloads likewise;
* the pure-torch reference on CUDA: identical codes where its arithmetic is the same
  (TernGrad, onebit bits), else the documented invariants (DGC selects {|x| >= t}; QSGD
  levels decode to the reference's values from the same norms).

Skipped without a GPU (``requires_cuda``); run by ``ci/gpu_check.sh`` on one.
"""
from __future__ import annotations

import math

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.bench.shapes import resnet50_shapes

pytestmark = pytest.mark.requires_cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SIZES = [(0,), (1,), (7,), (8 * 1000 + 1,), (5, 7), (64, 3, 7, 7)]
RESNET_SHAPES = sorted(set(resnet50_shapes()), key=lambda s: (math.prod(s), s))
CODECS = {
    "onebit": ("onebit", {}),
    "terngrad": ("terngrad", {"seed": 3, "rank_stream": 1}),
    "qsgd": ("qsgd", {"bits": 4, "bucket": 512, "seed": 5, "rank_stream": 2}),
    "qsgd_max8": ("qsgd", {"bits": 8, "bucket": 100, "norm": "max", "seed": 7}),
    "qsgd_elias": ("qsgd", {"bits": 4, "bucket": 512, "coding": "elias", "seed": 5}),
    "dgc": ("dgc", {"density": 0.01, "sample": 0.05, "seed": 9}),
}


def _ids(x):
    return str(x).replace("torch.", "") if isinstance(x, torch.dtype) else "x".join(map(str, x)) or "scalar"


@pytest.fixture(scope="module", autouse=True)
def _native_cuda():
    ok, why = hgc.native_cuda_status()
    assert ok, f"the CUDA tests need the native CUDA kernels: {why}"


def _grad(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.7).to(dtype)


def _codec(key, impl="native"):
    name, opts = CODECS[key]
    return hgc.get_codec(name, impl=impl, **opts)


def _encode(codec, g):
    """(payload, residual after) of one encode; onebit with a zero residual."""
    if getattr(codec, "fuses_feedback", False):
        r = torch.zeros_like(g)
        return codec.encode(g, r), r
    if getattr(codec, "shared_scale", False):
        return codec.encode(g, scale=codec.local_scale(g)), None
    return codec.encode(g), None


def _to(payload, device):
    bufs = {k: b.to(device) for k, b in payload.buffers.items()}
    return type(payload)(bufs, payload.shape, payload.dtype, torch.device(device))


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{what}: bytes differ"


def _assert_payloads(key, gpu, cpu) -> None:
    assert tuple(gpu.buffers) == tuple(cpu.buffers)
    for name in cpu.buffers:
        if key == "onebit" and name == "scales":
            # column means: double sums in another order, rounded to float32
            torch.testing.assert_close(gpu.buffers[name].cpu(), cpu.buffers[name], rtol=2e-7, atol=0)
        else:
            _same(gpu.buffers[name], cpu.buffers[name], f"{key} buffer {name!r}")


def _decode_mean(codec, stacked_or_list, scale):
    if isinstance(stacked_or_list, list):
        fn = codec.decode_mean_list
    else:
        fn = codec.decode_mean_stacked
    return fn(stacked_or_list, scale)


def _check_one(key, shape, dtype, seed=0):
    g = _grad(shape, dtype, seed)
    cpu_codec, gpu_codec = _codec(key), _codec(key)
    p_cpu, r_cpu = _encode(cpu_codec, g)
    p_gpu, r_gpu = _encode(gpu_codec, g.cuda())
    assert all(b.is_cuda for b in p_gpu.buffers.values())
    _assert_payloads(key, p_gpu, p_cpu)
    if r_cpu is not None:  # onebit's new residual: v - decode, with the (nearly) same scales
        eps = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)
        top = g.double().abs().max().item() if g.numel() else 0.0
        torch.testing.assert_close(r_gpu.cpu().double(), r_cpu.double(), rtol=0, atol=4 * eps * (1 + top))
    if key == "dgc":
        assert gpu_codec.last_threshold == cpu_codec.last_threshold
        assert gpu_codec.last_path == cpu_codec.last_path
    # both wire directions, same decoded bytes
    d_cpu = cpu_codec.decode(p_cpu)
    _same(gpu_codec.decode(_to(p_cpu, "cuda")), d_cpu, f"{key}: CPU payload decoded on the GPU")
    d_gpu_on_cpu = cpu_codec.decode(_to(p_gpu, "cpu"))
    _same(gpu_codec.decode(p_gpu), d_gpu_on_cpu, f"{key}: GPU payload decoded on the CPU")
    return g, p_cpu, p_gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", SIZES, ids=_ids)
@pytest.mark.parametrize("key", list(CODECS))
def test_cuda_equals_cpu(key, shape, dtype):
    _check_one(key, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("key", list(CODECS))
def test_cuda_equals_cpu_resnet50_shapes(key, dtype):
    for i, shape in enumerate(RESNET_SHAPES):
        _check_one(key, shape, dtype, seed=i)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("key", ["onebit", "terngrad", "qsgd", "qsgd_max8"])
def test_cuda_decode_sum_of_stacked_payloads(key, dtype, stack_payloads):
    """K = 3 payloads in one strided receive buffer: the GPU's fused decode-sum == the CPU's."""
    shape = (37, 29)
    codec = _codec(key)
    payloads = []
    for k in range(3):
        g = _grad(shape, dtype, seed=10 + k)
        if key == "terngrad":  # the shared scale, as the exchange agrees on it
            payloads.append(codec.encode(g, scale=1.5))
        else:
            payloads.append(_encode(codec, g)[0])
    stacked_cpu = stack_payloads(payloads)
    stacked_gpu = stack_payloads([_to(p, "cuda") for p in payloads])
    want = _decode_mean(_codec(key), stacked_cpu, 0.25)
    got = _decode_mean(_codec(key), stacked_gpu, 0.25)
    assert got.is_cuda
    _same(got, want, f"{key}: decode-sum of 3 stacked payloads")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_cuda_terngrad_unequal_scales_weighted_path(dtype, stack_payloads):
    codec = _codec("terngrad")
    payloads = [codec.encode(_grad((301,), dtype, seed=k), scale=1.0 + k) for k in range(3)]
    want = _decode_mean(_codec("terngrad"), stack_payloads(payloads), None)
    got = _decode_mean(_codec("terngrad"), stack_payloads([_to(p, "cuda") for p in payloads]), None)
    _same(got, want, "terngrad weighted decode-sum")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_cuda_dgc_decode_list(dtype):
    codec = _codec("dgc")
    payloads = [codec.encode(_grad((4099,), dtype, seed=k)) for k in range(3)]
    want = _decode_mean(_codec("dgc"), payloads, None)
    got = _decode_mean(_codec("dgc"), [_to(p, "cuda") for p in payloads], None)
    _same(got, want, "dgc decode-sum of 3 payloads")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("key", list(CODECS))
def test_cuda_native_vs_reference_on_cuda(key, dtype):
    """The pure-torch reference, run on the GPU, against the native CUDA kernels."""
    g = _grad((8 * 1000 + 1,), dtype, seed=4).cuda()
    native, ref = _codec(key), _codec(key, impl="reference")
    p_nat, _ = _encode(native, g)
    if key == "dgc":
        # the reference takes the exact top-k; the native selection is {|x| >= t} for its t
        sel = native.indices_of(p_nat).long()
        want = torch.nonzero(g.abs() >= native.last_threshold).view(-1)
        assert torch.equal(sel, want)
        assert torch.equal(p_nat.buffers["values"], g[want])
        dec = ref.decode(_to(p_nat, "cuda"))
        _same(native.decode(p_nat), dec, "dgc: native vs reference decode on CUDA")
        return
    p_ref, _ = _encode(ref, g)
    if key == "terngrad":
        _assert_payloads(key, p_nat, p_ref)
    elif key == "onebit":
        _same(p_nat.buffers["bits"], p_ref.buffers["bits"], "onebit bits vs reference on CUDA")
        torch.testing.assert_close(p_nat.buffers["scales"], p_ref.buffers["scales"], rtol=1e-6, atol=0)
    else:
        # QSGD: the reference sums the norms in torch's order on CUDA; decode the native
        # payload with the reference decoder (same norms) and compare values
        torch.testing.assert_close(p_nat.buffers["norms"], p_ref.buffers["norms"], rtol=1e-6, atol=0)
        ref_dec = ref.decode(p_nat)
        _same(native.decode(p_nat), ref_dec, f"{key}: native vs reference decode of the native payload")
        assert torch.equal(ref.levels_of(p_nat).cpu(), ref.levels_of(_to(p_nat, "cpu")).cpu())


def test_cuda_dgc_accumulate_matches_cpu():
    from horovod_gradcomp import _C

    for dtype in (torch.float32, torch.float64):
        for nesterov in (False, True):
            g = _grad((1001,), dtype, 1)
            u, v = _grad((1001,), dtype, 2), _grad((1001,), dtype, 3)
            ug, vg = u.cuda(), v.cuda()
            _C.dgc_accumulate_(u, v, g, 0.9, nesterov, 0.5)
            _C.dgc_accumulate_(ug, vg, g.cuda(), 0.9, nesterov, 0.5)
            _same(ug, u, "dgc_accumulate u")
            _same(vg, v, "dgc_accumulate v")


def test_cuda_dgc_index_code_matches_cpu():
    from horovod_gradcomp import _C

    n = 1 << 20
    gen = torch.Generator().manual_seed(0)
    for count in (1, 100, 5000, 300000):
        idx = torch.randperm(n, generator=gen)[:count].sort().values.to(torch.int32)
        code = _C.dgc_index_encode(idx, n)
        _same(_C.dgc_index_encode(idx.cuda(), n), code, f"index code of {count}")
        _same(_C.dgc_index_decode(code.cuda(), count, n), idx, f"index decode of {count}")
    bad = torch.tensor([5, 3], dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="strictly increasing"):
        _C.dgc_index_encode(bad, 10)


def test_cuda_bad_payloads_raise():
    codec = _codec("qsgd_elias")
    p = codec.encode(_grad((3000,), torch.float32).cuda())
    stream = p.buffers["stream"].clone()
    stream.fill_(0)
    bad = type(p)({"norms": p.buffers["norms"], "nbits": p.buffers["nbits"], "stream": stream}, p.shape, p.dtype,
                  p.device)
    with pytest.raises(RuntimeError, match="malformed"):
        codec.decode(bad)
    dgc = _codec("dgc")
    q = dgc.encode(_grad((3000,), torch.float32).cuda())
    code = torch.tensor([5, 3], dtype=torch.int32, device="cuda").view(torch.uint8)  # absolute, decreasing
    rev = type(q)({"indices": code, "values": torch.ones(2, device="cuda")}, q.shape, q.dtype, q.device)
    with pytest.raises(RuntimeError, match="strictly increasing"):
        _decode_mean(dgc, [q, rev], None)


def test_native_available_cuda_reports_the_path():
    ok, why = hgc.native_cuda_status()
    assert ok and hgc.native_available("cuda")
    assert "CUDA" in why
