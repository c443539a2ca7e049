"""onebit's rows mode (``scales="rows"``) for every impl: natural-order bits, a+ and a- per row.

The oracle is the columns-mode CPU kernel on one row at a time: row r's scales are, bitwise, those
of ``onebit_encode(G[r], residual[r], cols=1)`` (each row summed as a one-column tensor), and the
residual update and the decode are that encode's and its decode's, row by row; the bits are
``v >= 0`` in the flat row-major order (computed here with numpy). Native (CPU kernels) and twin
(the device kernels on the CPU) are held to it bitwise, the reference to a tolerance (torch sums
in its own order). Also: decode-sum of K = 1..4 payloads, payload sizes, measure, and the bucket
ops of a bucket mixing both modes against the per-tensor ops.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.native import require_native, require_twin

from device_helpers import DTYPES, device_calls, dtype_id

pytestmark = pytest.mark.timeout(120)

IMPLS = ["reference", "native", "twin"]
# Rows of length 0, 1, 7, 8, 8k+1 (rows that start mid-byte), around the 16 lanes and the 2048-value
# blocks of the one-column order; a 1-D tensor (one group) and an empty one of each orientation.
SHAPES = [(3, 0), (0, 4), (1, 7), (5, 8), (4, 17), (6, 3, 3), (2, 1025), (3, 2049), (9,), (0,)]


def _shape_id(s):
    return "x".join(map(str, s)) or "scalar"


def _groups(shape):
    return shape[0] if len(shape) >= 2 else 1


def _row_len(shape):
    return int(np.prod(shape[1:])) if len(shape) >= 2 else int(np.prod(shape))


def _rows(t):
    """t as [groups, row length] (a 1-D tensor: one row)."""
    return t.reshape(_groups(t.shape), _row_len(t.shape))


def _data(shape, dtype, seed, with_residual):
    """(g, r or None): seeded values, with zeros of v = g + r at every third element."""
    gen = torch.Generator().manual_seed(seed)
    g = (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.7 + 0.1).to(dtype)
    r = (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3).to(dtype) if with_residual else None
    g.view(-1)[::3] = 0
    if r is not None:
        r.view(-1)[::3] = 0
    return g, r


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{what}: bytes differ"


def _close(a, b, what, dtype=torch.float32):
    """Equal to the reference's tolerance: float sums in another order, then rounded to ``dtype``."""
    tol = {torch.float16: (1e-2, 2e-3), torch.bfloat16: (2e-2, 2e-2)}.get(dtype, (1e-5, 1e-5))
    torch.testing.assert_close(a.double(), b.double(), rtol=tol[0], atol=tol[1], msg=what)


def _np_bits(g, r):
    """Packed v >= 0 in flat order, v in the arithmetic dtype (float; double for fp64)."""
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    v = g.to(acc) if r is None else g.to(acc) + r.to(acc)
    return torch.from_numpy(np.packbits((v.reshape(-1) >= 0).numpy(), bitorder="little"))


def _oracle(g, r):
    """(bits, scales, residual after, decoded) of rows mode, from the columns-mode CPU kernel on
    each row alone (cols=1)."""
    C = require_native()
    groups = _groups(g.shape)
    rows = g.reshape(groups, _row_len(g.shape))
    res_rows = None if r is None else _rows(r).clone()
    pos, neg, decoded = [], [], []
    for i in range(groups):
        res = None if res_rows is None else res_rows[i]
        bits, s = C.onebit_encode(rows[i].contiguous(), res, 1)
        pos.append(s[0])
        neg.append(s[1])
        decoded.append(C.onebit_decode(bits, s, rows.shape[1], 1, g.dtype))
    scales = torch.stack(pos + neg) if groups else torch.zeros(0)
    dec = torch.cat(decoded).view(g.shape) if groups else torch.zeros(g.shape, dtype=g.dtype)
    return _np_bits(g, r), scales, None if res_rows is None else res_rows.view(g.shape), dec


def _row_payloads(g, r):
    """Each row's columns-mode (cols=1) payload, the residual rows updated in place."""
    C = require_native()
    groups = _groups(g.shape)
    rows, res = _rows(g), None if r is None else _rows(r)
    return [C.onebit_encode(rows[i].contiguous(), None if res is None else res[i], 1) for i in range(groups)]


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_rows_mode_is_each_row_encoded_alone(impl, dtype, shape, with_residual):
    """Bits in flat order, scales, residual and decode: the per-row oracle (bitwise but for the reference)."""
    codec = hgc.get_codec("onebit", impl=impl, scales="rows")
    g, r = _data(shape, dtype, 1, with_residual)
    exp_bits, exp_scales, exp_res, exp_dec = _oracle(g, None if r is None else r.clone())
    payload = codec.encode(g, r)
    bits, scales = payload.buffers["bits"], payload.buffers["scales"]
    assert payload.nbytes == codec.payload_nbytes(shape, dtype) == (g.numel() + 7) // 8 + 8 * _groups(shape)
    assert torch.equal(bits, exp_bits), f"{impl}: bits differ from v >= 0 in flat order"
    decoded = codec.decode(payload)
    if impl == "reference":
        _close(scales, exp_scales, "scales")
        if r is not None:
            _close(r, exp_res, "residual", dtype)
        _close(decoded, exp_dec, "decode", dtype)
        return
    _same(scales, exp_scales, f"{impl} scales")
    if r is not None:
        _same(r, exp_res, f"{impl} residual")
    _same(decoded, exp_dec, f"{impl} decode")
    out = torch.full_like(g, 7.0)
    assert codec.decode(payload, out=out) is out
    _same(out, exp_dec, f"{impl} decode into out")


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_rows_mode_decode_sum_of_k_payloads(impl, dtype, shape):
    """scale * the sum of K = 1..4 payloads: the CPU kernel's decode-sum of each row's K payloads."""
    C = require_native()
    codec = hgc.get_codec("onebit", impl=impl, scales="rows")
    groups, m = _groups(shape), _row_len(shape)
    for k in range(1, 5):
        grads = [_data(shape, dtype, 10 + q, False)[0] for q in range(k)]
        payloads = [codec.encode(g) for g in grads]
        stacked = Payload({b: torch.stack([p.buffers[b] for p in payloads]) for b in ("bits", "scales")}, shape, dtype,
                          torch.device("cpu"))
        mean = codec.decode_mean_stacked(stacked)
        per_row = [_row_payloads(g, None) for g in grads]
        rows = [C.onebit_decode_sum(torch.stack([per_row[q][i][0] for q in range(k)]),
                                    torch.stack([per_row[q][i][1] for q in range(k)]), m, 1, dtype, 1.0 / k)
                for i in range(groups)]
        expected = torch.cat(rows).view(shape) if groups else torch.zeros(shape, dtype=dtype)
        if impl == "reference":
            _close(mean, expected, f"K={k}", dtype)
        else:
            _same(mean, expected, f"{impl} K={k}")


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("impl", IMPLS)
def test_rows_mode_measure_then_pack(impl, with_residual):
    """measure() gives the encode's scales; encode(..., scales=measure) the same payload and residual."""
    codec = hgc.get_codec("onebit", impl=impl, scales="rows")
    assert codec.measures
    for shape in [(4, 17), (6, 3, 3), (3, 0), (9,)]:
        g, r = _data(shape, torch.float32, 3, with_residual)
        r2 = None if r is None else r.clone()
        scales = codec.measure(g, r)
        whole = codec.encode(g, r)
        _same(scales, whole.buffers["scales"], f"{impl} {shape} measured scales")
        packed = codec.encode(g, r2, scales=scales)
        _same(packed.buffers["bits"], whole.buffers["bits"], f"{impl} {shape} bits")
        if r is not None:
            _same(r2, r, f"{impl} {shape} residual")


# -- a bucket at once -------------------------------------------------------------------------
BUCKET = [((3, 0), torch.float32), ((1, 7), torch.float32), ((5, 8), torch.float16), ((4, 17), torch.float32),
          ((6, 3, 3), torch.float64), ((2, 1025), torch.bfloat16), ((129, 3), torch.float32), ((9,), torch.float32),
          ((0, 5), torch.float64), ((3, 2049), torch.float32)]


def _bucket(seed, with_residual):
    gen = torch.Generator().manual_seed(seed)
    grads = [(torch.randn(s, generator=gen, dtype=torch.float64) * 0.7).to(dt) for s, dt in BUCKET]
    res = [(torch.randn(s, generator=gen, dtype=torch.float64) * 0.2).to(dt).view(-1) for s, dt in BUCKET]
    return grads, (res if with_residual else None)


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_mixed_bucket_ops_are_the_per_tensor_ops(with_residual):
    """onebit_encode_many / onebit_scales_many / onebit_decode_sum_many of a bucket mixing rows and
    columns mode (per-tensor by_rows) and dtypes: bitwise each tensor's own op, on the twin."""
    tw = require_twin()
    grads, res = _bucket(7, with_residual)
    by_rows = [i % 2 == 0 for i in range(len(grads))]
    groups = [(g.shape[0] if g.dim() >= 2 else 1) if rows else (1 if g.dim() <= 1 else g[0].numel())
              for g, rows in zip(grads, by_rows)]
    flats = [g.reshape(-1) for g in grads]
    res_one = None if res is None else [r.clone() for r in res]
    bits, scales = tw.onebit_encode_many(flats, res, groups, None, by_rows)
    measured = tw.onebit_scales_many(flats, res_one, groups, by_rows)
    for i, (f, c, rows) in enumerate(zip(flats, groups, by_rows)):
        b, s = tw.onebit_encode(f, None if res_one is None else res_one[i], c, None, rows)
        _same(bits[i], b, f"tensor {i} bits")
        _same(scales[i], s, f"tensor {i} scales")
        _same(measured[i], s, f"tensor {i} measured scales")
        if res is not None:
            _same(res[i], res_one[i], f"tensor {i} residual")
    k = 3
    stacked_bits = [torch.stack([b, b.flip(0), b]) for b in bits]
    stacked_scales = [torch.stack([s, s * 2, -s]) for s in scales]
    n = [g.numel() for g in grads]
    dtypes = [g.dtype for g in grads]
    means = tw.onebit_decode_sum_many(stacked_bits, stacked_scales, n, groups, dtypes, 1.0 / k, [None] * len(grads),
                                      by_rows)
    for i in range(len(grads)):
        one = tw.onebit_decode_sum(stacked_bits[i], stacked_scales[i], n[i], groups[i], dtypes[i], 1.0 / k, None,
                                   by_rows[i])
        _same(means[i], one, f"tensor {i} decode-sum")
        cpu = require_native().onebit_decode_sum(stacked_bits[i], stacked_scales[i], n[i], groups[i], dtypes[i],
                                                 1.0 / k, None, by_rows[i])
        _same(means[i], cpu, f"tensor {i} decode-sum (CPU kernels)")


def test_bucket_calls_do_not_grow_with_rows_mode():
    """A rows-mode bucket of one dtype: at most 5 device calls to encode, 1 to decode-sum, as in columns mode."""
    tw = require_twin()
    codec = hgc.get_codec("onebit", impl="twin", scales="rows")
    assert codec.bucket_ops([torch.device("cpu")])
    grads = [torch.randn(s) for s in [(4, 17), (6, 3, 3), (9,), (129, 3), (2, 1025)]]
    res = [torch.zeros_like(g) for g in grads]
    payloads = []
    assert device_calls(tw, lambda: payloads.extend(codec.encode_many(grads, res))) <= 5
    assert device_calls(tw, lambda: codec.decode_many(payloads)) <= 1


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_codec_bucket_ops_are_native_per_tensor(with_residual):
    """OneBitCodec(impl="twin", scales="rows") through its bucket ops == impl="native" tensor by tensor."""
    twin = hgc.get_codec("onebit", impl="twin", scales="rows")
    native = hgc.get_codec("onebit", impl="native", scales="rows")
    grads, res = _bucket(11, with_residual)
    res_t = None if res is None else [r.clone().view(g.shape) for r, g in zip(res, grads)]
    res_n = None if res is None else [r.clone().view(g.shape) for r, g in zip(res, grads)]
    pt, pn = twin.encode_many(grads, res_t), native.encode_many(grads, res_n)
    for i, (a, b) in enumerate(zip(pt, pn)):
        for name in ("bits", "scales"):
            _same(a.buffers[name], b.buffers[name], f"tensor {i} {name}")
        if res is not None:
            _same(res_t[i], res_n[i], f"tensor {i} residual")
    for i, (a, b) in enumerate(zip(twin.decode_many(pt), native.decode_many(pn))):
        _same(a, b, f"tensor {i} decode")
    for i, (a, b) in enumerate(zip(twin.measure_many(grads, res_t), native.measure_many(grads, res_n))):
        _same(a, b, f"tensor {i} measure")


def test_rows_mode_refusals():
    C = require_native()
    with pytest.raises(RuntimeError, match="do not split into 4 rows"):
        C.onebit_encode(torch.zeros(10), None, 4, None, True)
    with pytest.raises(RuntimeError, match="expected 6 scales"):
        C.onebit_decode(torch.zeros(2, dtype=torch.uint8), torch.zeros(4), 12, 3, torch.float32, None, True)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rows_mode_on_cuda_is_the_cpu_kernels(dtype):
    """impl="native" on CUDA tensors (the device kernels, single tensor and bucket ops): bitwise the
    CPU kernels' payloads, residuals and decodes."""
    codec = hgc.get_codec("onebit", scales="rows")
    shapes = [(4, 17), (6, 3, 3), (2, 1025), (3, 0), (9,), (300, 33)]
    data = [_data(s, dtype, 5, True) for s in shapes]
    res_gpu = [r.cuda() for _, r in data]
    for (g, r), rg in zip(data, res_gpu):
        pc, pg = codec.encode(g, r.clone()), codec.encode(g.cuda(), rg.clone())
        for name in ("bits", "scales"):
            _same(pg.buffers[name].cpu(), pc.buffers[name], f"{tuple(g.shape)} {name}")
        _same(codec.decode(pg).cpu(), codec.decode(pc), f"{tuple(g.shape)} decode")
    res_cpu = [r.clone() for _, r in data]
    many_gpu = codec.encode_many([g.cuda() for g, _ in data], res_gpu)
    many_cpu = codec.encode_many([g for g, _ in data], res_cpu)
    for i, (a, b) in enumerate(zip(many_gpu, many_cpu)):
        for name in ("bits", "scales"):
            _same(a.buffers[name].cpu(), b.buffers[name], f"bucket tensor {i} {name}")
        _same(res_gpu[i].cpu(), res_cpu[i], f"bucket tensor {i} residual")
    for i, (a, b) in enumerate(zip(codec.decode_many(many_gpu), codec.decode_many(many_cpu))):
        _same(a.cpu(), b, f"bucket tensor {i} decode")
