"""The device kernels (csrc/device/, Thrust) against the native CPU kernels and the references.

Every test runs on each *device backend*:

* ``twin``: the device sources built by g++ with Thrust's OpenMP backend (``_C_twin``), fed CPU
  tensors: the same algorithm calls and functors as on a GPU, executed in CI on every commit;
* ``cuda``: the same sources built by nvcc (``_C``), fed CUDA tensors (skipped without a GPU;
  run by ``ci/gpu_check.sh`` on one).

For every codec (onebit, TernGrad, QSGD fixed and Elias, DGC), dtype (fp16/bf16/fp32/fp64)
and size (0, 1, 7, 31, 32, 33, 8k+1, one above 2^20, the ResNet-50 shapes):

* the payload encoded by the device kernels has the CPU kernels' bytes, scales and norms
  included (every reduction that feeds a payload has one fixed order on both);
* both wire directions: a device payload decodes on the CPU, a CPU payload decodes on the
  device, with identical values; decode-sum of K = 1..8 strided payloads likewise;
* malformed payloads and the fuzz corpus are refused with the CPU's messages.
"""
from __future__ import annotations

import math

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.bench.shapes import resnet50_shapes
from horovod_gradcomp.native import require_native, require_twin

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SIZES = [(0,), (1,), (7,), (31,), (32,), (33,), (8 * 1000 + 1,), ((1 << 20) + 3,), (5, 7), (64, 3, 7, 7)]
RESNET_SHAPES = sorted(set(resnet50_shapes()), key=lambda s: (math.prod(s), s))
CODECS = {
    "onebit": ("onebit", {}),
    "terngrad": ("terngrad", {"seed": 3, "rank_stream": 1}),
    "terngrad_clip": ("terngrad", {"seed": 3, "rank_stream": 1, "clip": 2.5}),
    "qsgd": ("qsgd", {"bits": 4, "bucket": 512, "seed": 5, "rank_stream": 2}),
    "qsgd_max8": ("qsgd", {"bits": 8, "bucket": 100, "norm": "max", "seed": 7}),
    "qsgd_elias": ("qsgd", {"bits": 4, "bucket": 512, "coding": "elias", "seed": 5}),
    "dgc": ("dgc", {"density": 0.01, "sample": 0.05, "seed": 9}),
}


def _ids(x):
    return str(x).replace("torch.", "") if isinstance(x, torch.dtype) else "x".join(map(str, x)) or "scalar"


class Backend:
    """Where the device kernels run: ``twin`` (``_C_twin``, CPU tensors) or ``cuda`` (``_C``,
    CUDA tensors). ``impl`` is the codec implementation that reaches them."""

    def __init__(self, name: str):
        self.name = name
        self.impl = "twin" if name == "twin" else "native"
        self.device = torch.device("cpu" if name == "twin" else "cuda")

    @property
    def module(self):
        return require_twin() if self.name == "twin" else require_native()

    def put(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)

    def is_here(self, t: torch.Tensor) -> bool:
        return t.device.type == self.device.type

    def sync(self) -> None:
        if self.name == "cuda":
            torch.cuda.synchronize()


@pytest.fixture(params=["twin", pytest.param("cuda", marks=pytest.mark.requires_cuda)], scope="module")
def dev(request) -> Backend:
    backend = Backend(request.param)
    if backend.name == "twin":
        require_twin()  # raises, naming why, when _C_twin is missing: never a skip
    else:
        ok, why = hgc.native_cuda_status()
        assert ok, f"the CUDA tests need the native CUDA kernels: {why}"
    return backend


def _grad(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.7).to(dtype)


def _codec(key, impl="native"):
    name, opts = CODECS[key]
    return hgc.get_codec(name, impl=impl, **opts)


def _encode(codec, g, feedback=True):
    """(payload, residual after) of one encode; onebit with a residual (zeros, then a second
    step's leftover when ``feedback``) or without one."""
    if getattr(codec, "fuses_feedback", False):
        if not feedback:
            return codec.encode(g), None
        r = (_grad(g.shape, g.dtype, seed=99) * 0.1).to(g.device)
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
    if not torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)):
        diff = (a.reshape(-1).view(torch.uint8) != b.reshape(-1).view(torch.uint8)).nonzero()
        raise AssertionError(f"{what}: bytes differ ({diff.numel()} of {a.numel() * a.element_size()}, first at "
                             f"byte {int(diff[0])})")


def _assert_payloads(key, dev_payload, cpu_payload) -> None:
    assert tuple(dev_payload.buffers) == tuple(cpu_payload.buffers)
    for name in cpu_payload.buffers:
        _same(dev_payload.buffers[name], cpu_payload.buffers[name], f"{key} buffer {name!r}")


def _decode_mean(codec, stacked_or_list, scale):
    if isinstance(stacked_or_list, list):
        fn = codec.decode_mean_list
    else:
        fn = codec.decode_mean_stacked
    return fn(stacked_or_list, scale)


def _check_one(dev, key, shape, dtype, seed=0, feedback=True):
    g = _grad(shape, dtype, seed)
    cpu_codec, dev_codec = _codec(key), _codec(key, dev.impl)
    p_cpu, r_cpu = _encode(cpu_codec, g, feedback)
    p_dev, r_dev = _encode(dev_codec, dev.put(g), feedback)
    assert all(dev.is_here(b) for b in p_dev.buffers.values())
    _assert_payloads(key, p_dev, p_cpu)
    if r_cpu is not None:  # onebit's new residual: v - decode, with the same scales
        _same(r_dev, r_cpu, f"{key}: residual after the encode")
    if key == "dgc":
        assert dev_codec.last_threshold == cpu_codec.last_threshold
        assert dev_codec.last_path == cpu_codec.last_path
    # both wire directions, same decoded bytes
    d_cpu = cpu_codec.decode(p_cpu)
    _same(dev_codec.decode(_to(p_cpu, dev.device)), d_cpu, f"{key}: CPU payload decoded by the device kernels")
    d_dev_on_cpu = cpu_codec.decode(_to(p_dev, "cpu"))
    _same(dev_codec.decode(p_dev), d_dev_on_cpu, f"{key}: device payload decoded on the CPU")
    return g, p_cpu, p_dev


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", SIZES, ids=_ids)
@pytest.mark.parametrize("key", list(CODECS))
def test_device_equals_cpu(dev, key, shape, dtype):
    _check_one(dev, key, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", [(7,), (33,), (64, 3, 7, 7)], ids=_ids)
def test_device_onebit_without_feedback(dev, shape, dtype):
    _check_one(dev, "onebit", shape, dtype, feedback=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("shape", [(64, 3, 7, 7), (300, 1000)], ids=_ids)
def test_device_onebit_column_windows(dev, shape, dtype):
    """The two-phase exchange's column windows (widths 2, 7, 8, 9, 296; first, middle and last):
    encoded and decoded in place by the device kernels with the CPU kernels' bytes (more cases,
    twin only: tests/test_device_onebit.py)."""
    C, D = require_native(), dev.module
    g = _grad(shape, dtype, seed=21)
    cols = math.prod(shape[1:])
    for width in (w for w in (2, 7, 8, 9, 296) if w <= cols):
        for c0 in sorted({0, (cols - width) // 2, cols - width}):
            r_cpu = _grad(shape, dtype, seed=22) * 0.3
            r_dev = dev.put(r_cpu.clone())  # (on the twin, put() returns the same tensor)
            want = C.onebit_encode_columns(g, r_cpu, cols, c0, c0 + width)
            got = D.onebit_encode_columns(dev.put(g), r_dev, cols, c0, c0 + width)
            what = f"onebit window [{c0}, {c0 + width}) of {shape}"
            _same(got[0], want[0], f"{what}: bits")
            _same(got[1], want[1], f"{what}: scales")
            _same(r_dev, r_cpu, f"{what}: residual")
            out_cpu = _grad(shape, dtype, seed=23)
            out_dev = dev.put(out_cpu.clone())
            C.onebit_decode_columns(want[0], want[1], out_cpu, cols, c0, c0 + width)
            D.onebit_decode_columns(dev.put(want[0]), dev.put(want[1]), out_dev, cols, c0, c0 + width)
            _same(out_dev, out_cpu, f"{what}: decode")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("key", list(CODECS))
def test_device_equals_cpu_resnet50_shapes(dev, key, dtype):
    for i, shape in enumerate(RESNET_SHAPES):
        _check_one(dev, key, shape, dtype, seed=i)


@pytest.mark.parametrize("K", range(1, 9))
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("key", ["onebit", "terngrad", "qsgd", "qsgd_max8"])
def test_device_decode_sum_of_stacked_payloads(dev, key, dtype, K, stack_payloads):
    """K payloads in one strided receive buffer: the device's fused decode-sum == the CPU's."""
    shape = (37, 29)
    codec = _codec(key)
    payloads = []
    for k in range(K):
        g = _grad(shape, dtype, seed=10 + k)
        if key == "terngrad":  # the shared scale, as the exchange agrees on it
            payloads.append(codec.encode(g, scale=1.5))
        else:
            payloads.append(_encode(codec, g)[0])
    stacked_cpu = stack_payloads(payloads)
    stacked_dev = stack_payloads([_to(p, dev.device) for p in payloads])
    want = _decode_mean(_codec(key), stacked_cpu, 1.0 / K)
    got = _decode_mean(_codec(key, dev.impl), stacked_dev, 1.0 / K)
    assert dev.is_here(got)
    _same(got, want, f"{key}: decode-sum of {K} stacked payloads")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_device_terngrad_unequal_scales_weighted_path(dev, dtype, stack_payloads):
    codec = _codec("terngrad")
    payloads = [codec.encode(_grad((301,), dtype, seed=k), scale=1.0 + k) for k in range(3)]
    want = _decode_mean(_codec("terngrad"), stack_payloads(payloads), None)
    got = _decode_mean(_codec("terngrad", dev.impl), stack_payloads([_to(p, dev.device) for p in payloads]), None)
    _same(got, want, "terngrad weighted decode-sum")


@pytest.mark.parametrize("K", [1, 2, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_device_dgc_decode_list(dev, dtype, K):
    codec = _codec("dgc")
    payloads = [codec.encode(_grad((4099,), dtype, seed=k)) for k in range(K)]
    want = _decode_mean(_codec("dgc"), payloads, None)
    got = _decode_mean(_codec("dgc", dev.impl), [_to(p, dev.device) for p in payloads], None)
    _same(got, want, f"dgc decode-sum of {K} payloads")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("key", list(CODECS))
def test_device_kernels_vs_reference(dev, key, dtype):
    """The pure-torch reference, on the backend's device, against the device kernels."""
    g = dev.put(_grad((8 * 1000 + 1,), dtype, seed=4))
    native, ref = _codec(key, dev.impl), _codec(key, impl="reference")
    p_nat, _ = _encode(native, g)
    if key == "dgc":
        # the reference takes the exact top-k; the native selection is {|x| >= t} for its t
        sel = native.indices_of(p_nat).long()
        want = torch.nonzero(g.abs() >= native.last_threshold).view(-1)
        assert torch.equal(sel, want)
        assert torch.equal(p_nat.buffers["values"], g[want])
        dec = ref.decode(_to(p_nat, dev.device))
        _same(native.decode(p_nat), dec, "dgc: device kernels vs reference decode")
        return
    p_ref, _ = _encode(ref, g)
    if key.startswith("terngrad"):
        _assert_payloads(key, p_nat, p_ref)
    elif key == "onebit":
        _same(p_nat.buffers["bits"], p_ref.buffers["bits"], "onebit bits vs reference")
        torch.testing.assert_close(p_nat.buffers["scales"], p_ref.buffers["scales"], rtol=1e-6, atol=0)
    else:
        # QSGD: the reference sums the norms in torch's order; decode the device payload with
        # the reference decoder (same norms) and compare values
        torch.testing.assert_close(p_nat.buffers["norms"], p_ref.buffers["norms"], rtol=1e-6, atol=0)
        ref_dec = ref.decode(p_nat)
        _same(native.decode(p_nat), ref_dec, f"{key}: device kernels vs reference decode of their payload")
        assert torch.equal(ref.levels_of(p_nat).cpu(), ref.levels_of(_to(p_nat, "cpu")).cpu())


def test_device_dgc_accumulate_matches_cpu(dev):
    C, D = require_native(), dev.module
    for dtype in (torch.float32, torch.float64):
        for nesterov in (False, True):
            g = _grad((1001,), dtype, 1)
            u, v = _grad((1001,), dtype, 2), _grad((1001,), dtype, 3)
            ud, vd = dev.put(u.clone()), dev.put(v.clone())
            C.dgc_accumulate_(u, v, g, 0.9, nesterov, 0.5)
            D.dgc_accumulate_(ud, vd, dev.put(g), 0.9, nesterov, 0.5)
            _same(ud, u, "dgc_accumulate u")
            _same(vd, v, "dgc_accumulate v")


def test_device_dgc_index_code_matches_cpu(dev):
    C, D = require_native(), dev.module
    n = 1 << 20
    gen = torch.Generator().manual_seed(0)
    for count in (1, 100, 5000, 300000):
        idx = torch.randperm(n, generator=gen)[:count].sort().values.to(torch.int32)
        code = C.dgc_index_encode(idx, n)
        _same(D.dgc_index_encode(dev.put(idx), n), code, f"index code of {count}")
        _same(D.dgc_index_decode(dev.put(code), count, n), idx, f"index decode of {count}")
    bad = dev.put(torch.tensor([5, 3], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="strictly increasing"):
        D.dgc_index_encode(bad, 10)


def test_device_bad_payloads_raise(dev):
    codec = _codec("qsgd_elias", dev.impl)
    p = codec.encode(dev.put(_grad((3000,), torch.float32)))
    stream = p.buffers["stream"].clone()
    stream.fill_(0)
    bad = type(p)({"norms": p.buffers["norms"], "nbits": p.buffers["nbits"], "stream": stream}, p.shape, p.dtype,
                  p.device)
    with pytest.raises(RuntimeError, match="malformed"):
        codec.decode(bad)
    dgc = _codec("dgc", dev.impl)
    q = dgc.encode(dev.put(_grad((3000,), torch.float32)))
    code = dev.put(torch.tensor([5, 3], dtype=torch.int32)).view(torch.uint8)  # absolute, decreasing
    rev = type(q)({"indices": code, "values": dev.put(torch.ones(2))}, q.shape, q.dtype, q.device)
    with pytest.raises(RuntimeError, match="strictly increasing"):
        _decode_mean(dgc, [q, rev], None)


@pytest.mark.requires_cuda
def test_native_available_cuda_reports_the_path():
    ok, why = hgc.native_cuda_status()
    assert ok and hgc.native_available("cuda")
    assert "CUDA" in why


# -- malformed payloads: the CUDA decoders check what the CPU decoders check ---------------------
#
# Each case builds a malformed payload for one native decoder (on the CPU: the corpus is built
# and mutated there), then calls the decoder with it on the CPU and on the GPU: both must raise,
# the same exception with the same message (csrc/payload_checks.h holds one check function per
# decoder, used by both entry points), and the GPU must stay usable after it (no launch that read
# or wrote out of bounds). The kinds are test_decode_fuzz.py's: truncated and extended buffers,
# wrong dtypes and dims, K = 0 and mismatched K, non-contiguous rows, size arguments out of
# range (2^56 + 1), DGC indices out of range / not increasing, corrupt Elias headers and codes.

N_BIG = 2 ** 56 + 1


def _malformed_cases():
    """(name, decoder, args): _C's arguments, in order; tensors on the CPU, or a callable that
    builds the tensor on a given device (layouts that ``.to()`` would not keep)."""
    from horovod_gradcomp import _C

    f32, u8 = torch.float32, torch.uint8
    x = _grad((96,), torch.float32, seed=21)
    n = x.numel()
    cases = []

    def add(name, fn, *args):
        cases.append((name, fn, list(args)))

    # onebit: bits [K, 12], scales [K, 2 * cols]
    bits, sc = _C.onebit_encode(x, None, 4)
    b2, s2 = bits.expand(2, -1).contiguous(), sc.expand(2, -1).contiguous()
    add("onebit truncated bits", "onebit_decode_sum", b2[:, :-1], s2, n, 4, f32, 0.5, None)
    add("onebit missing scales", "onebit_decode_sum", b2, s2[:, :-1], n, 4, f32, 0.5, None)
    add("onebit bits wrong dtype", "onebit_decode_sum", b2.to(torch.int8), s2, n, 4, f32, 0.5, None)
    add("onebit scales wrong dtype", "onebit_decode_sum", b2, s2.double(), n, 4, f32, 0.5, None)
    add("onebit K=0", "onebit_decode_sum", b2[:0], s2[:0], n, 4, f32, 0.5, None)
    add("onebit K mismatch", "onebit_decode_sum", b2, s2[:1], n, 4, f32, 0.5, None)
    add("onebit 1-D bits", "onebit_decode_sum", bits, s2[:1], n, 4, f32, 1.0, None)
    add("onebit strided rows", "onebit_decode_sum", lambda dev: torch.zeros(2, 24, dtype=u8, device=dev)[:, ::2], s2,
        n, 4, f32, 0.5, None)  # built on the device: .to() would make it contiguous
    add("onebit n > 2^56", "onebit_decode_sum", b2, s2, N_BIG, 1, f32, 0.5, None)
    add("onebit cols > 2^56", "onebit_decode_sum", b2, s2, 0, N_BIG, f32, 0.5, None)
    add("onebit columns", "onebit_decode_sum", b2, s2, n, 5, f32, 0.5, None)
    add("onebit int output", "onebit_decode_sum", b2, s2, n, 4, torch.int32, 0.5, None)
    # TernGrad: codes [K, 24], scales [K, 1]
    codes, tsc = _C.terngrad_encode(x, 2.0, float("inf"), 1, 2)
    c2, t2 = codes.expand(2, -1).contiguous(), tsc.expand(2, -1).contiguous()
    add("terngrad truncated codes", "terngrad_decode_sum", c2[:, :-1], t2, n, f32, 1.0, None)
    add("terngrad no scale", "terngrad_decode_sum", c2, t2[:, :0], n, f32, 1.0, None)
    add("terngrad codes wrong dtype", "terngrad_decode_sum", c2.to(torch.int32), t2, n, f32, 1.0, None)
    add("terngrad K=0", "terngrad_decode_sum", c2[:0], t2[:0], n, f32, 1.0, None)
    add("terngrad K mismatch", "terngrad_decode_sum", c2, t2[:1], n, f32, 1.0, None)
    add("terngrad 1-D codes", "terngrad_decode_sum", codes, t2[:1], n, f32, 1.0, None)
    add("terngrad n > 2^56", "terngrad_decode_sum", c2, t2, N_BIG, f32, 1.0, None)
    # QSGD fixed: s = 15 (5-bit codes), buckets of 40: norms [K, 3], packed [K, 60]
    norms, packed = _C.qsgd_encode_fixed(x, 15, 40, False, 3)
    add("qsgd truncated packed", "qsgd_decode_fixed", norms, packed[:-1], n, 15, 40, f32, 1.0, None)
    add("qsgd extended packed", "qsgd_decode_fixed", norms, torch.cat([packed, packed[:3]]), n, 15, 40, f32, 1.0,
        None)
    add("qsgd missing norm", "qsgd_decode_fixed", norms[:-1], packed, n, 15, 40, f32, 1.0, None)
    add("qsgd norms wrong dtype", "qsgd_decode_fixed", norms.double(), packed, n, 15, 40, f32, 1.0, None)
    add("qsgd mixed dims", "qsgd_decode_fixed", norms[None], packed, n, 15, 40, f32, 1.0, None)
    add("qsgd K=0", "qsgd_decode_fixed", norms[None][:0], packed[None][:0], n, 15, 40, f32, 1.0, None)
    add("qsgd K mismatch", "qsgd_decode_fixed", norms.expand(2, -1), packed[None], n, 15, 40, f32, 1.0, None)
    add("qsgd n > 2^56", "qsgd_decode_fixed", norms, packed, N_BIG, 15, 40, f32, 1.0, None)
    add("qsgd levels 0", "qsgd_decode_fixed", norms, packed, n, 0, 40, f32, 1.0, None)
    add("qsgd bucket 0", "qsgd_decode_fixed", norms, packed, n, 15, 0, f32, 1.0, None)
    add("qsgd int output", "qsgd_decode_fixed", norms, packed, n, 15, 40, torch.int64, 1.0, None)
    # QSGD Elias: groups of 1 bucket of 16 values: 6 groups
    y = _grad((96,), torch.float32, seed=22)
    en, nb, st = _C.qsgd_encode_elias(y, 7, 16, False, 3, 1)
    assert nb.numel() == 6 and st.numel() > 6
    add("elias truncated stream", "qsgd_decode_elias", en, nb, st[:-1], n, 7, 16, 1, f32, None)
    add("elias extended stream", "qsgd_decode_elias", en, nb, torch.cat([st, st[:2]]), n, 7, 16, 1, f32, None)
    huge = nb.clone()
    huge[2] = 2 ** 62
    add("elias bit count overflow", "qsgd_decode_elias", en, huge, st, n, 7, 16, 1, f32, None)
    neg = nb.clone()
    neg[0] = -8
    add("elias negative bit count", "qsgd_decode_elias", en, neg, st, n, 7, 16, 1, f32, None)
    add("elias nbits wrong dtype", "qsgd_decode_elias", en, nb.int(), st, n, 7, 16, 1, f32, None)
    add("elias missing group", "qsgd_decode_elias", en, nb[:-1], st, n, 7, 16, 1, f32, None)
    add("elias missing norm", "qsgd_decode_elias", en[:-1], nb, st, n, 7, 16, 1, f32, None)
    add("elias 2-D stream", "qsgd_decode_elias", en, nb, st[None], n, 7, 16, 1, f32, None)
    add("elias n > 2^56", "qsgd_decode_elias", en, nb, st, N_BIG, 7, 16, 1, f32, None)
    add("elias group_buckets 0", "qsgd_decode_elias", en, nb, st, n, 7, 16, 0, f32, None)
    # codes that overrun their group: a consistent header over a zeroed / random stream, and a
    # group whose bit count is cut short (the stream shortened to match)
    add("elias zeroed codes", "qsgd_decode_elias", en, nb, torch.zeros_like(st), n, 7, 16, 1, f32, None)
    gen = torch.Generator().manual_seed(5)
    add("elias random codes", "qsgd_decode_elias", en, nb, torch.randint(0, 256, st.shape, generator=gen,
                                                                         dtype=u8), n, 7, 16, 1, f32, None)
    last = int(nb[-1])
    if last > 8:
        short = nb.clone()
        short[-1] = last - 8
        add("elias code overruns its group", "qsgd_decode_elias", en, short, st[:-1], n, 7, 16, 1, f32, None)
    over = nb.clone()
    over[0] += 8
    over[1] -= 8
    add("elias bit counts shifted", "qsgd_decode_elias", en, over, st, n, 7, 16, 1, f32, None)
    # DGC scatter-sum: K = 2 payloads, the second malformed (the error names payload 1)
    i32 = torch.int32
    ok_i, ok_v = torch.tensor([1, 5, 9], dtype=i32), torch.ones(3)
    add("dgc index == n", "dgc_scatter_sum", [ok_i, torch.tensor([2, n], dtype=i32)], [ok_v, torch.ones(2)], n,
        f32, 1.0, None)
    add("dgc index huge", "dgc_scatter_sum", [ok_i, torch.tensor([2, 2 ** 31 - 1], dtype=i32)], [ok_v, ok_v[:2]], n,
        f32, 1.0, None)
    add("dgc negative index", "dgc_scatter_sum", [ok_i, torch.tensor([-1, 3], dtype=i32)], [ok_v, ok_v[:2]], n, f32,
        1.0, None)
    add("dgc decreasing", "dgc_scatter_sum", [ok_i, torch.tensor([5, 3], dtype=i32)], [ok_v, ok_v[:2]], n, f32, 1.0,
        None)
    add("dgc duplicate", "dgc_scatter_sum", [ok_i, torch.tensor([3, 3], dtype=i32)], [ok_v, ok_v[:2]], n, f32, 1.0,
        None)
    add("dgc int64 indices", "dgc_scatter_sum", [ok_i, ok_i.long()], [ok_v, ok_v], n, f32, 1.0, None)
    add("dgc values wrong dtype", "dgc_scatter_sum", [ok_i, ok_i], [ok_v, ok_v.double()], n, f32, 1.0, None)
    add("dgc truncated values", "dgc_scatter_sum", [ok_i, ok_i], [ok_v, ok_v[:2]], n, f32, 1.0, None)
    add("dgc 2-D indices", "dgc_scatter_sum", [ok_i, ok_i[None]], [ok_v, ok_v], n, f32, 1.0, None)
    add("dgc K mismatch", "dgc_scatter_sum", [ok_i, ok_i], [ok_v], n, f32, 1.0, None)
    add("dgc n > 2^56", "dgc_scatter_sum", [ok_i.long()], [ok_v], N_BIG, f32, 1.0, None)
    add("dgc int output", "dgc_scatter_sum", [ok_i], [ok_v], n, torch.int32, 1.0, None)
    # DGC index code (n = 1000)
    idx = torch.tensor([3, 10, 400, 999], dtype=i32)
    code1 = _C.dgc_index_encode(idx[:2], 1000)  # 1-byte gaps
    add("index code wrong length", "dgc_index_decode", code1[:-1], 2, 1000)
    add("index count > n", "dgc_index_decode", torch.zeros(20, dtype=u8), 20, 10)
    add("index gaps run past n", "dgc_index_decode", torch.full((5,), 255, dtype=u8), 5, 1000)
    add("index 2-byte gaps run past n", "dgc_index_decode", torch.full((4,), 255, dtype=u8), 2, 1000)
    add("index absolute out of range", "dgc_index_decode", torch.tensor([3, 1000], dtype=i32).view(u8), 2, 1000)
    add("index absolute decreasing", "dgc_index_decode", torch.tensor([7, 3], dtype=i32).view(u8), 2, 1000)
    add("index absolute negative", "dgc_index_decode", torch.tensor([-4, 3], dtype=i32).view(u8), 2, 1000)
    add("index code wrong dtype", "dgc_index_decode", code1.to(torch.int8), 2, 1000)
    add("index 2-D code", "dgc_index_decode", code1[None], 2, 1000)
    add("index n > 2^56", "dgc_index_decode", code1, 2, N_BIG)
    return cases


def _on(args, device):
    def one(a):
        if isinstance(a, torch.Tensor):
            return a.to(device)
        if isinstance(a, list):
            return [one(b) for b in a]
        return a(device) if callable(a) else a
    return [one(a) for a in args]


def _outcome(fn, args):
    try:
        fn(*args)
    except (RuntimeError, ValueError, TypeError) as e:
        return type(e), str(e).splitlines()[0]
    return None, "returned"


def _collect_malformed():
    """The cases (built with the native CPU kernels), or none when _C did not load (the
    backend fixture reports that)."""
    try:
        return _malformed_cases()
    except ImportError:
        return []


_MALFORMED = _collect_malformed()


@pytest.mark.parametrize("case", range(len(_MALFORMED)), ids=[c[0] for c in _MALFORMED])
def test_device_decoder_refuses_malformed_payload_like_cpu(dev, case):
    C, D = require_native(), dev.module
    name, fn, args = _MALFORMED[case]
    want = _outcome(getattr(C, fn), _on(args, "cpu"))
    assert want[0] is not None, f"{name}: the CPU decoder accepted it"
    got = _outcome(getattr(D, fn), _on(args, dev.device))
    dev.sync()  # a launch that faulted would surface here
    assert got == want, f"{name}: {dev.name} {got} vs CPU {want}"
    # the device is still usable: a valid decode after the refusal
    good = D.dgc_index_decode(dev.put(torch.tensor([0, 4], dtype=torch.uint8)), 2, 10)
    assert good.cpu().tolist() == [0, 5]


def test_malformed_cases_cover_every_decoder():
    names = {fn for _, fn, _ in _malformed_cases()}
    assert names == {"onebit_decode_sum", "terngrad_decode_sum", "qsgd_decode_fixed", "qsgd_decode_elias",
                     "dgc_scatter_sum", "dgc_index_decode"}


@pytest.mark.requires_cuda
def test_cuda_decoders_check_devices():
    """Buffers of one payload split between the CPU and the GPU: refused before any launch."""
    from horovod_gradcomp import _C

    x = _grad((96,), torch.float32, seed=23)
    bits, sc = _C.onebit_encode(x, None, 4)
    with pytest.raises(RuntimeError, match="different devices"):
        _C.onebit_decode_sum(bits[None].cuda(), sc[None], 96, 4, torch.float32, 1.0, None)
    codes, tsc = _C.terngrad_encode(x, 2.0, float("inf"), 1, 2)
    with pytest.raises(RuntimeError, match="codes must be a CUDA tensor"):
        _C.terngrad_decode_sum(codes[None], tsc[None].cuda(), 96, torch.float32, 1.0, None)
    norms, nb, st = _C.qsgd_encode_elias(x, 7, 16, False, 3, 1)
    with pytest.raises(RuntimeError, match="stream must be a CUDA tensor"):
        _C.qsgd_decode_elias(norms.cuda(), nb.cuda(), st, 96, 7, 16, 1, torch.float32, None)
    i = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        _C.dgc_scatter_sum([i.cuda(), i.cuda()], [torch.ones(2, device="cuda"), torch.ones(2)], 96, torch.float32)
    with pytest.raises(RuntimeError, match="out is on"):
        _C.onebit_decode_sum(bits[None].cuda(), sc[None].cuda(), 96, 4, torch.float32, 1.0, torch.empty(96))


def test_device_dgc_refusal_leaves_out_untouched(dev):
    """As on the CPU, DGC indices are checked before the sum is written into ``out``."""
    D = dev.module
    out = dev.put(torch.full((50,), 7.0))
    with pytest.raises(RuntimeError, match="payload 1: indices must be strictly increasing"):
        D.dgc_scatter_sum([dev.put(torch.tensor([1, 2], dtype=torch.int32)),
                           dev.put(torch.tensor([4, 50], dtype=torch.int32))],
                          [dev.put(torch.ones(2)), dev.put(torch.ones(2))], 50, torch.float32, 1.0, out)
    assert torch.equal(out.cpu(), torch.full((50,), 7.0))


@pytest.mark.timeout(600)
def test_device_raw_decoders_survive_the_fuzz_corpus(dev):
    """tests/fuzz_decoders.py's raw target (the native entry points called directly with
    truncated, extended, random, bit-flipped, mistyped, reshaped buffers and out-of-range size
    arguments), decoded by the device kernels; in a subprocess, so that a fault names its case."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    fuzz = Path(__file__).with_name("fuzz_decoders.py")
    proc = subprocess.run([sys.executable, str(fuzz), "--target", "raw", "--seed", "11", "--cases", "600",
                           "--impls", "native"] + (["--device", "cuda"] if dev.name == "cuda" else ["--kernels", "twin"]),
                          capture_output=True, text=True, timeout=540,
                          cwd=str(fuzz.parent.parent))
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    cases = [ln for ln in lines if ln.startswith("CASE ")]
    assert proc.returncode == 0 and summary.get("failures") == 0, (
        f"exit {proc.returncode}; last case {cases[-1] if cases else None}\n"
        + "\n".join(ln for ln in lines if ln.startswith("FAIL"))[:4000] + "\n" + proc.stderr[-3000:])
    outcomes = summary["outcomes"]
    assert outcomes.get("output", 0) > 60 and sum(v for k, v in outcomes.items() if k != "output") > 60, outcomes
