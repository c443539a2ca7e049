"""onebit's bucket ops on the OpenMP twin (``onebit_encode_many``, ``onebit_decode_sum_many``:
csrc/device/multi_tensor.cuh), bitwise against the native CPU kernels tensor by tensor, and the
number of device algorithm calls of a bucket, which must not grow with its tensor count.
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.codecs.onebit import onebit_columns
from horovod_gradcomp.native import require_native, require_twin

from device_helpers import device_calls
from one_rank import OneRank

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# The sizes (0, 1, 7, 31, 32, 33, 8k+1, one above 2^20) as 1-D tensors, plus matrices
# around the 128-row blocks, an empty matrix of each orientation and a convolution.
BUCKET = [(0,), (1,), (7,), (31,), (32,), (33,), (8 * 129 + 1,), ((1 << 20) + 3,), (5, 7), (129, 3), (300, 33),
          (0, 5), (5, 0), (16, 3, 3, 3)]


@pytest.fixture(scope="module")
def tw():
    return require_twin()


@pytest.fixture(scope="module")
def cpu():
    return require_native()


def _grads(shapes, dtypes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=gen, dtype=torch.float64) * 0.7).to(dt) for s, dt in zip(shapes, dtypes)]


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{what}: bytes differ"


def _encode_both(tw, cpu, grads, with_residual):
    """(bucket op's bits, scales, residuals), (CPU kernels' ones, tensor by tensor)."""
    cols = [onebit_columns(g.shape) for g in grads]
    res_bucket = [g.flip(0).clone().view(-1) * 0.5 for g in grads] if with_residual else None
    res_cpu = [r.clone() for r in res_bucket] if with_residual else None
    bits, scales = tw.onebit_encode_many([g.reshape(-1) for g in grads], res_bucket, cols)
    ref = [cpu.onebit_encode(g.reshape(-1), res_cpu[i] if with_residual else None, cols[i])
           for i, g in enumerate(grads)]
    return (bits, scales, res_bucket), ([b for b, _ in ref], [s for _, s in ref], res_cpu)


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_bucket_encode_is_the_cpu_kernels_bitwise(tw, cpu, dtype, with_residual):
    grads = _grads(BUCKET, [dtype] * len(BUCKET))
    (bits, scales, res), (rbits, rscales, rres) = _encode_both(tw, cpu, grads, with_residual)
    for i, shape in enumerate(BUCKET):
        _same(bits[i], rbits[i], f"bits of {shape}")
        _same(scales[i], rscales[i], f"scales of {shape}")
        if with_residual:
            _same(res[i], rres[i], f"residual of {shape}")


def test_mixed_dtypes_in_one_bucket(tw, cpu):
    shapes = [(33,), (7, 9), (1,), (130, 2), (0,), (8 * 17 + 1,), (3, 3, 3), (64,)]
    dtypes = [DTYPES[i % 4] for i in range(len(shapes))]
    (bits, scales, res), (rbits, rscales, rres) = _encode_both(tw, cpu, _grads(shapes, dtypes, seed=3), True)
    for i in range(len(shapes)):
        _same(bits[i], rbits[i], f"bits {i}")
        _same(scales[i], rscales[i], f"scales {i}")
        _same(res[i], rres[i], f"residual {i}")


@pytest.mark.parametrize("k", range(1, 9))
def test_bucket_decode_is_the_cpu_kernels_bitwise(tw, cpu, k):
    shapes = [(0,), (1,), (31,), (8 * 40 + 1,), (129, 3), (300, 33), (16, 3, 3, 3)]
    dtypes = [DTYPES[(i + k) % 4] for i in range(len(shapes))]
    payloads = [tw.onebit_encode_many([g.reshape(-1) for g in _grads(shapes, dtypes, seed=10 + q)], None,
                                      [onebit_columns(s) for s in shapes]) for q in range(k)]
    # each tensor's K payloads as rows of one receive buffer (strided rows, as the exchange gets them)
    stacked_bits, stacked_scales = [], []
    for i in range(len(shapes)):
        b = torch.stack([p[0][i] for p in payloads])
        s = torch.stack([p[1][i] for p in payloads])
        stacked_bits.append(torch.cat([b, torch.zeros(k, 3, dtype=torch.uint8)], 1)[:, :b.shape[1]])
        stacked_scales.append(s)
    n = [torch.Size(s).numel() for s in shapes]
    cols = [onebit_columns(s) for s in shapes]
    outs = tw.onebit_decode_sum_many(stacked_bits, stacked_scales, n, cols, dtypes, 1.0 / k, [None] * len(shapes))
    for i in range(len(shapes)):
        ref = cpu.onebit_decode_sum(stacked_bits[i], stacked_scales[i], n[i], cols[i], dtypes[i], 1.0 / k)
        _same(outs[i], ref, f"decode of {shapes[i]} at K={k}")


def test_a_bucket_costs_the_same_calls_whatever_its_tensor_count(tw):
    """encode: 5 calls (block sums, column finish, lane totals, lane finish, pack) for a bucket of
    matrices and 1-D tensors of one dtype; decode: 1. The same for 1, 3 and 40 tensors (a bucket of
    matrices only or 1-D tensors only skips the stages it has no index for)."""
    base = [(9, 4), (17,)]
    counts = {}
    for tensors in (2, 6, 40):
        shapes = [base[i % 2] for i in range(tensors)]
        grads = _grads(shapes, [torch.float32] * tensors)
        cols = [onebit_columns(s) for s in shapes]
        res = [torch.zeros_like(g).view(-1) for g in grads]
        enc = device_calls(tw, lambda: tw.onebit_encode_many([g.reshape(-1) for g in grads], res, cols))
        bits, scales = tw.onebit_encode_many([g.reshape(-1) for g in grads], None, cols)
        sb, ss = [b.unsqueeze(0) for b in bits], [s.unsqueeze(0) for s in scales]
        n = [g.numel() for g in grads]
        dec = device_calls(tw, lambda: tw.onebit_decode_sum_many(sb, ss, n, cols, [torch.float32] * tensors, 1.0,
                                                                  [None] * tensors))
        counts[tensors] = (enc, dec)
    assert set(counts.values()) == {(5, 1)}, counts
    # one launch sequence per dtype: a float32 matrix (sums, finish, pack) and a float16 1-D
    # tensor (sums, lane totals, lane finish, pack)
    grads = _grads([(9, 4), (17,)], [torch.float32, torch.float16])
    assert device_calls(tw, lambda: tw.onebit_encode_many([g.reshape(-1) for g in grads], None, [4, 1])) == 3 + 4


def test_refusals_name_the_problem(tw):
    g = [torch.randn(8), torch.randn(4, 2)]
    with pytest.raises(RuntimeError, match="column counts"):
        tw.onebit_encode_many(g, None, [1])
    with pytest.raises(RuntimeError, match="residuals"):
        tw.onebit_encode_many(g, [torch.zeros(8)], [1, 2])
    with pytest.raises(RuntimeError, match="do not split into columns"):
        tw.onebit_encode_many(g, None, [1, 3])
    with pytest.raises(RuntimeError, match="residual dtype"):
        tw.onebit_encode_many(g, [torch.zeros(8), torch.zeros(8, dtype=torch.float64)], [1, 2])
    bits, scales = tw.onebit_encode_many(g, None, [1, 2])
    with pytest.raises(RuntimeError, match="tensor 1 has 2 payloads, tensor 0 has 1"):
        tw.onebit_decode_sum_many([bits[0].unsqueeze(0), torch.stack([bits[1]] * 2)],
                                  [scales[0].unsqueeze(0), torch.stack([scales[1]] * 2)], [8, 8], [1, 2],
                                  [torch.float32] * 2, 1.0, [None, None])
    with pytest.raises(RuntimeError, match="one entry per tensor"):
        tw.onebit_decode_sum_many([bits[0].unsqueeze(0)], [], [8], [1], [torch.float32], 1.0, [None])


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_codec_encode_many_and_decode_many(with_residual):
    """OneBitCodec(impl="twin") takes the bucket ops; impl="native" goes tensor by tensor through
    the CPU kernels: the same payloads, residuals and means."""
    twin, native = hgc.get_codec("onebit", impl="twin"), hgc.get_codec("onebit", impl="native")
    assert twin.bucket_ops([torch.device("cpu")]) and not native.bucket_ops([torch.device("cpu")])
    assert hgc.get_codec("onebit", impl="twin", scales="rows").bucket_ops([torch.device("cpu")])
    grads = _grads(BUCKET[:8] + [(129, 3), (16, 3, 3, 3)], [torch.float32] * 10, seed=5)
    res_t = [torch.full_like(g, 0.25) for g in grads] if with_residual else None
    res_n = [r.clone() for r in res_t] if with_residual else None
    pt, pn = twin.encode_many(grads, res_t), native.encode_many(grads, res_n)
    for a, b in zip(pt, pn):
        for name in ("bits", "scales"):
            _same(a.buffers[name], b.buffers[name], name)
    if with_residual:
        for a, b in zip(res_t, res_n):
            _same(a, b, "residual")
    stacked = [Payload({k: torch.stack([v, v]) for k, v in p.buffers.items()}, p.shape, p.dtype) for p in pt]
    outs = [torch.empty_like(g) for g in grads]
    mt = twin.decode_mean_stacked_many(stacked, outs=outs)
    mn = native.decode_mean_stacked_many(stacked)
    for a, b, o in zip(mt, mn, outs):
        assert a is o
        _same(a, b, "mean")


@pytest.mark.parametrize("scales, encode_calls", [("rows", 4), ("columns", 5)])
def test_a_one_rank_exchange_through_the_bucket_ops_matches_native(tw, scales, encode_calls):
    """A whole step through the engine (preamble, allgather pattern, memory.encode_many, bucket
    decode): impl="twin" gives the native CPU kernels' results bitwise, over three steps, in one
    bucket encode (4 device calls in rows mode, 5 in columns mode: its column finish) and one
    bucket decode (1)."""
    shapes = {"a": (300, 40), "b": (77,), "c": (16, 3, 3, 3), "d": (1,)}
    named = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in shapes.items()]
    comps = {impl: hgc.Compression.codec("onebit", named, communicator=OneRank(), impl=impl, pattern="allgather",
                                         scales=scales) for impl in ("twin", "native")}
    for step in range(3):
        grads = {n: g for n, g in zip(shapes, _grads(list(shapes.values()), [torch.float32] * 4, seed=20 + step))}
        out = {"native": comps["native"].exchange({n: g.clone() for n, g in grads.items()})}
        calls = device_calls(tw, lambda: out.__setitem__("twin", comps["twin"].exchange(dict(grads))))
        assert calls == encode_calls + 1, calls
        for n in shapes:
            _same(out["twin"][n], out["native"][n], f"step {step} {n}")
