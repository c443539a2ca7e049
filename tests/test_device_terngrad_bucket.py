"""TernGrad's bucket ops on the OpenMP twin (``terngrad_scale_stats_many``, ``terngrad_encode_many``,
``terngrad_decode_sum_many``: csrc/device/multi_tensor.cuh), bitwise against the per-tensor ops
(the native CPU kernels and the twin's own single-tensor launchers), the codec's bucket methods
against impl="native" tensor by tensor, a one-rank exchange, and the number of device algorithm
calls of a bucket, which must not grow with its tensor count.
"""
from __future__ import annotations

import math
import struct

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.codecs.streams import stream_keys32
from horovod_gradcomp.native import require_native, require_twin

from device_helpers import DTYPES, device_calls, dtype_id
from one_rank import OneRank

# The sizes, two above the sigma's 65536 lanes, and shaped tensors.
SIZES = [0, 1, 7, 31, 32, 33, 8 * 1024 + 1, 65537, 300_001]
SHAPES = [(n,) for n in SIZES] + [(5, 7), (16, 3, 3, 3), (0, 5)]


@pytest.fixture(scope="module")
def tw():
    """The twin, or a skip naming why (not built, or built without TernGrad's bucket ops)."""
    try:
        twin = require_twin()
    except Exception as e:  # NativeUnavailableError
        pytest.skip(f"no OpenMP twin: {e}")
    if not hasattr(twin, "terngrad_encode_many"):
        pytest.skip("this twin has no TernGrad bucket ops (built before them, or without csrc/twin/terngrad_twin.cpp)")
    return twin


pytestmark = pytest.mark.usefixtures("tw")  # every test here needs the twin's bucket ops


@pytest.fixture(scope="module")
def cpu():
    return require_native()


def _grads(shapes, dtypes, seed=0, mean=0.0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=gen, dtype=torch.float64) * 0.7 + mean).to(dt) for s, dt in zip(shapes, dtypes)]


def _flat(grads):
    return [g.reshape(-1) for g in grads]


def _f64(v: float) -> bytes:
    return struct.pack("<d", v)


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{what}: bytes differ"


def _same_float(a: float, b: float, what):
    assert (math.isnan(a) and math.isnan(b)) or _f64(a) == _f64(b), f"{what}: {a!r} vs {b!r}"


def _keys(count, seed=7):
    return [stream_keys32(seed, 3, p) for p in range(count)]


# -- scale statistics ------------------------------------------------------------------------

@pytest.mark.parametrize("with_sigma", [False, True], ids=["max", "max+sigma"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_scale_stats_are_the_per_tensor_ops_bitwise(tw, cpu, dtype, with_sigma):
    grads = _flat(_grads(SHAPES, [dtype] * len(SHAPES), seed=1, mean=2.0))
    stats = tw.terngrad_scale_stats_many(grads, with_sigma)
    assert stats.dtype == torch.float64 and stats.shape == (2, len(grads))
    for i, g in enumerate(grads):
        _same_float(stats[0, i].item(), cpu.terngrad_max_abs(g), f"max of {g.numel()}")
        _same_float(stats[0, i].item(), tw.terngrad_max_abs(g), f"max of {g.numel()} (twin)")
        sigma = cpu.terngrad_sigma(g) if with_sigma else 0.0
        _same_float(stats[1, i].item(), sigma, f"sigma of {g.numel()}")


def test_scale_stats_special_values_and_mixed_dtypes(tw, cpu):
    grads = [torch.tensor([1.0, float("nan"), -3.0]), torch.tensor([1.0, float("-inf")], dtype=torch.float64),
             torch.full((1000,), -2.5, dtype=torch.float16), torch.tensor([-0.0, -0.0], dtype=torch.bfloat16),
             torch.zeros(0, dtype=torch.float64), torch.randn(70000).to(torch.bfloat16), torch.randn(33)]
    stats = tw.terngrad_scale_stats_many(grads, True)
    for i, g in enumerate(grads):
        _same_float(stats[0, i].item(), cpu.terngrad_max_abs(g), f"max {i}")
        _same_float(stats[1, i].item(), cpu.terngrad_sigma(g), f"sigma {i}")


@pytest.mark.parametrize("clip", [None, 2.5, 0.1], ids=["noclip", "clip2.5", "clip0.1"])
def test_local_scales_many_equals_local_scale(clip):
    twin = hgc.get_codec("terngrad", impl="twin", clip=clip)
    native = hgc.get_codec("terngrad", impl="native", clip=clip)
    shapes = SHAPES + [(4, 8)] * 4
    grads = _grads(shapes, [DTYPES[i % 4] for i in range(len(shapes))], seed=2, mean=0.3)
    grads[-1] = torch.full((4, 8), 1.5)  # constant: sigma 0, no clipping
    want = [native.local_scale(g) for g in grads]
    got = twin.local_scales_many(grads)
    for i, (a, b) in enumerate(zip(got, want)):
        _same_float(a, b, f"local scale of tensor {i} {tuple(grads[i].shape)} {grads[i].dtype}")
    assert native.local_scales_many(grads) == want  # not a bucket op: tensor by tensor


# -- encode ---------------------------------------------------------------------------------

def _encode_both(tw, cpu, grads, scales, clips):
    keys = _keys(len(grads))
    codes, bufs = tw.terngrad_encode_many(grads, scales, clips, [k[0] for k in keys], [k[1] for k in keys])
    ref = [cpu.terngrad_encode(g, s, c, k0, k1) for g, s, c, (k0, k1) in zip(grads, scales, clips, keys)]
    return (codes, bufs), ([r[0] for r in ref], [r[1] for r in ref])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bucket_encode_is_the_cpu_kernels_bitwise(tw, cpu, dtype):
    grads = _flat(_grads(SHAPES, [dtype] * len(SHAPES), seed=3))
    scales = [0.0 if i == 2 else 0.5 + 0.125 * i for i in range(len(grads))]  # one zero scale: all codes 0
    clips = [math.inf if i % 3 else 0.4 for i in range(len(grads))]
    (codes, bufs), (rcodes, rbufs) = _encode_both(tw, cpu, grads, scales, clips)
    for i, g in enumerate(grads):
        _same(codes[i], rcodes[i], f"codes of {g.numel()}")
        _same(bufs[i], rbufs[i], f"scale of {g.numel()}")


def test_bucket_encode_mixed_dtypes(tw, cpu):
    grads = _flat(_grads(SHAPES, [DTYPES[i % 4] for i in range(len(SHAPES))], seed=4))
    scales = [1.25] * len(grads)
    clips = [0.8 if i % 2 else math.inf for i in range(len(grads))]
    (codes, bufs), (rcodes, rbufs) = _encode_both(tw, cpu, grads, scales, clips)
    for i in range(len(grads)):
        _same(codes[i], rcodes[i], f"codes {i}")
        _same(bufs[i], rbufs[i], f"scale {i}")


def _encode_options(count, kind):
    if kind == "local":
        return None
    if kind == "given":
        return [{"scale": 0.75 + 0.01 * i} for i in range(count)]
    return [{"scale": 1.1} if i % 2 else {} for i in range(count)]  # some given, some local


@pytest.mark.parametrize("options", ["local", "given", "mixed"])
@pytest.mark.parametrize("clip", [None, 1.5], ids=["noclip", "clip"])
def test_codec_encode_many_is_encode_tensor_by_tensor(clip, options):
    """TernGradCodec(impl="twin").encode_many (bucket ops) == impl="native" tensor by tensor
    (encode from each position): payloads bitwise, and both streams left at the same position."""
    twin = hgc.get_codec("terngrad", impl="twin", clip=clip, seed=11, rank_stream=2)
    native = hgc.get_codec("terngrad", impl="native", clip=clip, seed=11, rank_stream=2)
    assert twin.bucket_ops([torch.device("cpu")]) and not native.bucket_ops([torch.device("cpu")])
    grads = _grads(SHAPES, [DTYPES[i % 4] for i in range(len(SHAPES))], seed=5)
    opts = _encode_options(len(grads), options)
    positions = [100 + 3 * i for i in range(len(grads))]
    pt = twin.encode_many(grads, None, opts, positions)
    pn = native.encode_many(grads, None, opts, positions)
    assert twin.counter == native.counter == positions[-1] + 1
    for i, (a, b) in enumerate(zip(pt, pn)):
        assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
        for name in ("codes", "scale"):
            _same(a.buffers[name], b.buffers[name], f"{name} of tensor {i}")
    # no positions: from the current position on, as encode() one after the other
    twin.reset_stream(5)
    native.reset_stream(5)
    pt, pn = twin.encode_many(grads[:4], None, opts[:4] if opts else None), [native.encode(g, **(
        opts[i] if opts else {})) for i, g in enumerate(grads[:4])]
    assert twin.counter == native.counter == 9
    for a, b in zip(pt, pn):
        _same(a.buffers["codes"], b.buffers["codes"], "codes from the current position")


# -- decode ---------------------------------------------------------------------------------

def _stacked(payloads_per_rank, i, pad=3):
    """Tensor i's K payloads as strided rows of one receive buffer (as the exchange gets them)."""
    codes = torch.stack([p[0][i] for p in payloads_per_rank])
    codes = torch.cat([codes, torch.zeros(codes.shape[0], pad, dtype=torch.uint8)], 1)[:, :codes.shape[1]]
    scales = torch.stack([p[1][i] for p in payloads_per_rank])
    return codes, scales


@pytest.mark.parametrize("shared", [True, False], ids=["shared-scale", "weighted"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_bucket_decode_is_the_cpu_kernels_bitwise(tw, cpu, k, shared):
    dtypes = [DTYPES[(i + k) % 4] for i in range(len(SHAPES))]
    flats = [g.numel() for g in _grads(SHAPES, dtypes)]
    ranks = []
    for q in range(k):
        grads = _flat(_grads(SHAPES, dtypes, seed=10 + q))
        scales = [0.9 if shared else 0.9 + 0.1 * q] * len(grads)
        keys = _keys(len(grads), seed=q)
        ranks.append(tw.terngrad_encode_many(grads, scales, [math.inf] * len(grads), [a for a, _ in keys],
                                             [b for _, b in keys]))
    codes, scales = zip(*[_stacked(ranks, i) for i in range(len(SHAPES))])
    outs = [torch.empty(n, dtype=dt) if i % 2 else None for i, (n, dt) in enumerate(zip(flats, dtypes))]
    got = tw.terngrad_decode_sum_many(list(codes), list(scales), flats, dtypes, 1.0 / k, outs)
    for i, n in enumerate(flats):
        want = cpu.terngrad_decode_sum(codes[i], scales[i], n, dtypes[i], 1.0 / k)
        _same(got[i], want, f"decode of {SHAPES[i]} at K={k}")
        if outs[i] is not None:
            assert got[i].data_ptr() == outs[i].data_ptr()


def test_codec_decode_mean_stacked_many(tw):
    twin, native = hgc.get_codec("terngrad", impl="twin"), hgc.get_codec("terngrad", impl="native")
    grads = _grads(SHAPES, [DTYPES[i % 4] for i in range(len(SHAPES))], seed=6)
    payloads = [twin.encode_many(grads, positions=[10 * q + i for i in range(len(grads))]) for q in range(3)]
    stacked = [Payload({name: torch.stack([p[i].buffers[name] for p in payloads]) for name in ("codes", "scale")},
                       g.shape, g.dtype) for i, g in enumerate(grads)]
    outs = [torch.empty_like(g) if i % 2 else None for i, g in enumerate(grads)]
    mt = twin.decode_mean_stacked_many(stacked, outs=outs)
    mn = native.decode_mean_stacked_many(stacked)
    for i, (a, b) in enumerate(zip(mt, mn)):
        if outs[i] is not None:
            assert a is outs[i]
        _same(a, b, f"mean of tensor {i}")
    mt = twin.decode_mean_stacked_many(stacked, scale=0.5)
    for i, (a, p) in enumerate(zip(mt, stacked)):
        _same(a, native.decode_mean_stacked(p, 0.5), f"mean of tensor {i} at scale 0.5")


# -- device algorithm calls per bucket -------------------------------------------------------

def _bucket_calls(tw, grads):
    """(stats without sigma, stats with sigma, encode, decode) device calls of one bucket."""
    flats, count = _flat(grads), len(grads)
    dtypes = [g.dtype for g in grads]
    keys = [0] * count
    calls = [device_calls(tw, lambda: tw.terngrad_scale_stats_many(flats, False)),
             device_calls(tw, lambda: tw.terngrad_scale_stats_many(flats, True))]
    enc = {}
    calls.append(device_calls(tw, lambda: enc.update(p=tw.terngrad_encode_many(flats, [1.0] * count,
                                                                                [math.inf] * count, keys, keys))))
    codes, scales = enc["p"]
    sc, ss = [c.unsqueeze(0) for c in codes], [s.unsqueeze(0) for s in scales]
    n = [f.numel() for f in flats]
    calls.append(device_calls(tw, lambda: tw.terngrad_decode_sum_many(sc, ss, n, dtypes, 1.0, [None] * count)))
    return tuple(calls)


def test_a_bucket_costs_the_same_calls_whatever_its_tensor_count(tw):
    """Per dtype: scale stats 4 calls (max lanes, 2 block levels, finish) or 10 with the sigma
    (+ 2 x (lanes, 2 levels)), encode 1, decode 2 (plans, sums), for buckets of 1, 3 and 40
    tensors (each bucket has a tensor of 8k+1 values, which needs both block levels; smaller
    ones, empty ones included, share its stages)."""
    sizes = [8 * 1024 + 1, 0, 1, 7, 31, 32, 33, 300]
    counts = {}
    for tensors in (1, 3, 40):
        shapes = [(sizes[i % len(sizes)],) for i in range(tensors)]
        counts[tensors] = _bucket_calls(tw, _grads(shapes, [torch.float32] * tensors, seed=tensors))
    assert set(counts.values()) == {(4, 10, 1, 2)}, counts
    # one launch sequence per dtype present
    mixed = _grads([(8 * 1024 + 1,)] * 4 + [(7,)] * 4, DTYPES * 2, seed=9)
    assert _bucket_calls(tw, mixed) == (4 * 4, 4 * 10, 4 * 1, 4 * 2)


def test_codec_bucket_calls(tw):
    """The codec's bucket methods: local scales one stats op, encode one encode op (+ one stats
    op when clipping needs the sigmas), decode one decode op."""
    grads = _grads([(8 * 1024 + 1,)] + [(33,)] * 20, [torch.float32] * 21, seed=12)
    for clip, stats_calls in ((None, 4), (2.0, 10)):
        codec = hgc.get_codec("terngrad", impl="twin", clip=clip)
        scales = {}
        assert device_calls(tw, lambda: scales.update(s=codec.local_scales_many(grads))) == stats_calls
        opts = [{"scale": s} for s in scales["s"]]
        encode_calls = 1 + (stats_calls if clip else 0)
        assert device_calls(tw, lambda: codec.encode_many(grads, None, opts, list(range(21)))) == encode_calls
        assert device_calls(tw, lambda: codec.encode_many(grads)) == 1 + stats_calls  # local scales
    payloads = codec.encode_many(grads)
    stacked = [Payload({k: v.unsqueeze(0) for k, v in p.buffers.items()}, p.shape, p.dtype) for p in payloads]
    assert device_calls(tw, lambda: codec.decode_mean_stacked_many(stacked)) == 2


# -- refusals -------------------------------------------------------------------------------

def test_refusals_name_the_problem(tw):
    g = [torch.randn(8), torch.randn(4, 2).reshape(-1)]
    with pytest.raises(RuntimeError, match="2 gradients but 1 scales"):
        tw.terngrad_encode_many(g, [1.0], [math.inf] * 2, [0, 0], [0, 0])
    with pytest.raises(RuntimeError, match="scale must be >= 0"):
        tw.terngrad_encode_many(g, [1.0, -1.0], [math.inf] * 2, [0, 0], [0, 0])
    with pytest.raises(RuntimeError, match="32-bit"):
        tw.terngrad_encode_many(g, [1.0, 1.0], [math.inf] * 2, [0, 1 << 32], [0, 0])
    meta = [torch.randn(8), torch.empty(8, device="meta")]
    for op in (lambda: tw.terngrad_scale_stats_many(meta, False),
               lambda: tw.terngrad_encode_many(meta, [1.0] * 2, [math.inf] * 2, [0, 0], [0, 0])):
        with pytest.raises(RuntimeError, match="gradient 1 is on meta.*a bucket is on one device"):
            op()
    with pytest.raises(RuntimeError, match="fp16, bf16, fp32 or fp64, got Long"):
        tw.terngrad_scale_stats_many([torch.arange(4)], False)
    codes, scales = tw.terngrad_encode_many(g, [1.0, 1.0], [math.inf] * 2, [0, 0], [0, 0])
    with pytest.raises(RuntimeError, match="tensor 1 has 2 payloads, tensor 0 has 1"):
        tw.terngrad_decode_sum_many([codes[0].unsqueeze(0), torch.stack([codes[1]] * 2)],
                                    [scales[0].unsqueeze(0), torch.stack([scales[1]] * 2)], [8, 8],
                                    [torch.float32] * 2, 1.0, [None, None])
    with pytest.raises(RuntimeError, match="one entry per tensor"):
        tw.terngrad_decode_sum_many([codes[0].unsqueeze(0)], [], [8], [torch.float32], 1.0, [None])
    with pytest.raises(RuntimeError, match="codes 1 is on meta"):
        tw.terngrad_decode_sum_many([codes[0].unsqueeze(0), torch.empty(1, 2, dtype=torch.uint8, device="meta")],
                                    [scales[0].unsqueeze(0)] * 2, [8, 8], [torch.float32] * 2, 1.0, [None, None])


def test_codec_refusals():
    codec = hgc.get_codec("terngrad", impl="twin")
    grads = [torch.randn(8), torch.randn(3)]
    with pytest.raises(ValueError, match="no residual"):
        codec.encode_many(grads, [torch.zeros(8), torch.zeros(3)])
    with pytest.raises(TypeError, match="unexpected options"):
        codec.encode_many(grads, None, [{"scale": 1.0}, {"clip": 2.0}])
    with pytest.raises(ValueError, match="scale must be >= 0"):
        codec.encode_many(grads, None, [{"scale": 1.0}, {"scale": -1.0}])
    with pytest.raises(ValueError, match="2 tensors but 1 encode options"):
        codec.encode_many(grads, None, [{}])
    one, two = codec.encode_many(grads[:1]), codec.encode_many(grads)
    stacked = [Payload({k: v.unsqueeze(0) for k, v in one[0].buffers.items()}, one[0].shape, one[0].dtype),
               Payload({k: torch.stack([v, v]) for k, v in two[1].buffers.items()}, two[1].shape, two[1].dtype)]
    with pytest.raises(ValueError, match="one K ranks, got K = \\[1, 2\\]"):
        codec.decode_mean_stacked_many(stacked)


# -- a whole exchange -----------------------------------------------------------------------


@pytest.mark.parametrize("clip", [None, 2.0], ids=["noclip", "clip"])
def test_a_one_rank_exchange_through_the_bucket_ops_matches_native(tw, clip):
    """A whole step through the engine (shared scales, allgather pattern, memory.encode_many,
    bucket decode): impl="twin" gives the native CPU kernels' results bitwise over three steps,
    in one scale-stats op, one encode op (+ a stats op with clipping) and one decode op."""
    shapes = {"a": (300, 40), "b": (77,), "c": (16, 3, 3, 3), "d": (1,), "e": (8 * 1024 + 1,)}
    named = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in shapes.items()]
    comps = {impl: hgc.Compression.codec("terngrad", named, communicator=OneRank(), impl=impl, pattern="allgather",
                                         clip=clip, seed=4)
             for impl in ("twin", "native")}
    stats_calls = 10 if clip else 4
    for step in range(3):
        grads = dict(zip(shapes, _grads(list(shapes.values()), [torch.float32] * 5, seed=20 + step)))
        out = {"native": comps["native"].exchange({n: g.clone() for n, g in grads.items()})}
        calls = device_calls(tw, lambda: out.__setitem__("twin", comps["twin"].exchange(dict(grads))))
        assert calls == stats_calls + (1 + (stats_calls if clip else 0)) + 2, calls
        for n in shapes:
            _same(out["twin"][n], out["native"][n], f"step {step} {n}")
