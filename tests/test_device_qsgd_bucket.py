"""QSGD's bucket ops on the OpenMP twin (``qsgd_encode_fixed_many``, ``qsgd_decode_fixed_many``,
``qsgd_encode_elias_many``, ``qsgd_decode_elias_many``: csrc/device/multi_tensor.cuh), bitwise
against the per-tensor ops (twin and native CPU kernels), the number of device algorithm calls of
a bucket (which must not grow with its tensor count), refusals with the per-tensor ops' messages,
QSGDCodec's bucket path and a one-rank exchange against impl="native".
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.codecs.qsgd import QSGDCodec, group_buckets
from horovod_gradcomp.native import require_native

from device_helpers import DTYPES, device_calls, dtype_id, outcome, twin  # noqa: F401 (fixture)
from one_rank import OneRank

# The sizes: 0, 1, 7, 31, 32, 33, 8k+1, and one of two Elias groups at most bucket sizes.
SIZES = [0, 1, 7, 31, 32, 33, 8 * 129 + 1, 70_001]
OPTIONS = [  # (levels s, bucket, max_norm): buckets dividing some sizes and not others
    (15, 512, False), (3, 7, True), (127, 33, False), (1, 32, True), (255, 1, False),
]
DTYPE_SETS = [[d] for d in DTYPES] + [DTYPES]  # one dtype, or all four mixed in one bucket
KEY0 = 0x1234_5678_9ABC_DEF0 - (1 << 63)  # keys with the sign bit set (two's complement)


def opt_id(o):
    return f"s{o[0]}-d{o[1]}-{'max' if o[2] else 'l2'}"


def set_id(dts):
    return "mixed" if len(dts) > 1 else dtype_id(dts[0])


@pytest.fixture(scope="module")
def cpu():
    return require_native()


def _grads(sizes, dtypes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(sizes):
        g = torch.randn(n, generator=gen, dtype=torch.float64) * 0.7
        if n > 10:
            g[::7] = 0.0  # runs of zeros for the Elias gaps
            g[3] = 5.0
        out.append(g.to(dtypes[i % len(dtypes)]))
    return out


def _keys(count, salt=0):
    return [KEY0 + 7919 * i + 104_729 * salt for i in range(count)]


def _same(a, b, what):
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()
    assert a.dtype == b.dtype and a.numel() == b.numel(), f"{what}: {a.dtype}[{a.numel()}] vs {b.dtype}[{b.numel()}]"
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{what}: bytes differ"


def _strided_rows(rows, pad):
    """The K rows stacked as strided rows of a wider buffer (as the exchange's receive buffer)."""
    width = rows[0].numel()
    buf = torch.zeros(len(rows), width + 2 * pad, dtype=rows[0].dtype)[:, pad:pad + width]
    for k, r in enumerate(rows):
        buf[k] = r
    return buf


def _mean_list(codec, payloads):
    """Codec.decode_mean_list of each tensor's payload list: the per-tensor path (reference)."""
    return [codec.decode_mean_list(ps) for ps in payloads]


# -- fixed-width coding -------------------------------------------------------------------------

@pytest.mark.parametrize("dtypes", DTYPE_SETS, ids=set_id)
@pytest.mark.parametrize("opt", OPTIONS, ids=opt_id)
def test_fixed_bucket_is_the_per_tensor_ops(twin, cpu, opt, dtypes):
    s, d, max_norm = opt
    xs = _grads(SIZES, dtypes, seed=s + d)
    K = 3
    encoded = [twin.qsgd_encode_fixed_many(xs, s, d, max_norm, _keys(len(xs), k)) for k in range(K)]
    for k, (norms, packed) in enumerate(encoded):
        for i, x in enumerate(xs):
            want = cpu.qsgd_encode_fixed(x, s, d, max_norm, _keys(len(xs), k)[i])
            got_twin = twin.qsgd_encode_fixed(x, s, d, max_norm, _keys(len(xs), k)[i])
            for name, a, b, c in zip(("norms", "packed"), (norms[i], packed[i]), want, got_twin):
                _same(a, b, f"{name} of n={x.numel()} {x.dtype} (payload {k})")
                _same(a, c, f"{name} of n={x.numel()} {x.dtype} vs the twin's per-tensor op")
    dts = [x.dtype for x in xs]
    n = [x.numel() for x in xs]
    for k_used in (1, K):
        sn = [_strided_rows([encoded[k][0][i] for k in range(k_used)], 1) for i in range(len(xs))]
        sp = [_strided_rows([encoded[k][1][i] for k in range(k_used)], 2) for i in range(len(xs))]
        means = twin.qsgd_decode_fixed_many(sn, sp, n, s, d, dts, 1.0 / k_used, [None] * len(xs))
        for i in range(len(xs)):
            want = cpu.qsgd_decode_fixed(sn[i], sp[i], n[i], s, d, dts[i], 1.0 / k_used)
            _same(means[i], want, f"decode-sum of n={n[i]} {dts[i]}, K={k_used}")
            _same(means[i], twin.qsgd_decode_fixed(sn[i], sp[i], n[i], s, d, dts[i], 1.0 / k_used), "twin op")


def test_fixed_decode_into_outs(twin, cpu):
    xs = _grads([5, 40, 0, 1033], [torch.float32, torch.float16])
    norms, packed = twin.qsgd_encode_fixed_many(xs, 15, 8, False, _keys(4))
    outs = [torch.full_like(x, 9.0) for x in xs]
    got = twin.qsgd_decode_fixed_many(norms, packed, [x.numel() for x in xs], 15, 8, [x.dtype for x in xs], 1.0,
                                      outs)
    for i, x in enumerate(xs):
        assert got[i].data_ptr() == outs[i].data_ptr() or x.numel() == 0
        _same(outs[i], cpu.qsgd_decode_fixed(norms[i], packed[i], x.numel(), 15, 8, x.dtype, 1.0), f"out {i}")


# -- Elias coding -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtypes", DTYPE_SETS, ids=set_id)
@pytest.mark.parametrize("opt", OPTIONS, ids=opt_id)
def test_elias_bucket_is_the_per_tensor_ops(twin, cpu, opt, dtypes):
    s, d, max_norm = opt
    gb = group_buckets(d)
    xs = _grads(SIZES, dtypes, seed=2 * s + d)
    K = 3
    encoded = [twin.qsgd_encode_elias_many(xs, s, d, max_norm, _keys(len(xs), k), gb) for k in range(K)]
    for k, bufs in enumerate(encoded):
        for i, x in enumerate(xs):
            want = cpu.qsgd_encode_elias(x, s, d, max_norm, _keys(len(xs), k)[i], gb)
            got_twin = twin.qsgd_encode_elias(x, s, d, max_norm, _keys(len(xs), k)[i], gb)
            for name, a, b, c in zip(("norms", "nbits", "stream"), (bufs[0][i], bufs[1][i], bufs[2][i]), want,
                                     got_twin):
                _same(a, b, f"{name} of n={x.numel()} {x.dtype} (payload {k})")
                _same(a, c, f"{name} of n={x.numel()} {x.dtype} vs the twin's per-tensor op")
    codec = QSGDCodec(impl="native", levels=s, bucket=d, norm="max" if max_norm else "l2", coding="elias")
    n = [x.numel() for x in xs]
    dts = [x.dtype for x in xs]
    for k_used in (1, K):
        lists = [[encoded[k][j][i] for k in range(k_used)] for j in range(3) for i in range(len(xs))]
        norms, nbits, streams = (lists[j * len(xs):(j + 1) * len(xs)] for j in range(3))
        means = twin.qsgd_decode_elias_many(norms, nbits, streams, n, s, d, gb, dts, 1.0 / k_used, [None] * len(xs))
        payloads = [[Payload({"norms": norms[i][k], "nbits": nbits[i][k], "stream": streams[i][k]}, x.shape, x.dtype)
                     for k in range(k_used)] for i, x in enumerate(xs)]
        for i, want in enumerate(_mean_list(codec, payloads)):
            _same(means[i], want, f"mean of n={n[i]} {dts[i]}, K={k_used}")


def test_elias_streams_are_views_of_one_buffer(twin):
    xs = _grads([100, 1, 70_001, 0, 33], [torch.float32])
    _, nbits, streams = twin.qsgd_encode_elias_many(xs, 7, 16, False, _keys(5), group_buckets(16))
    ptrs = [st.data_ptr() for st in streams if st.numel()]
    assert all(b - a == st.numel() for a, b, st in zip(ptrs, ptrs[1:], [st for st in streams if st.numel()]))
    assert [int(nb.numel()) for nb in nbits] == [1, 1, 2, 1, 1]


# -- device algorithm calls ---------------------------------------------------------------------

def _bucket_calls(twin, xs):
    """(encode fixed, decode fixed, encode Elias, decode Elias at K = 2) calls for the bucket xs."""
    s, d, gb = 15, 64, group_buckets(64)
    keys = _keys(len(xs))
    n, dts = [x.numel() for x in xs], [x.dtype for x in xs]
    enc_f = device_calls(twin, lambda: twin.qsgd_encode_fixed_many(xs, s, d, False, keys))
    norms, packed = twin.qsgd_encode_fixed_many(xs, s, d, False, keys)
    sn, sp = [t.expand(2, -1) for t in norms], [t.expand(2, -1) for t in packed]
    dec_f = device_calls(twin, lambda: twin.qsgd_decode_fixed_many(sn, sp, n, s, d, dts, 0.5, [None] * len(xs)))
    enc_e = device_calls(twin, lambda: twin.qsgd_encode_elias_many(xs, s, d, False, keys, gb))
    en, eb, es = twin.qsgd_encode_elias_many(xs, s, d, False, keys, gb)
    two = lambda bufs: [[b, b] for b in bufs]  # noqa: E731
    dec_e = device_calls(twin, lambda: twin.qsgd_decode_elias_many(two(en), two(eb), two(es), n, s, d, gb, dts, 0.5,
                                                                  [None] * len(xs)))
    return enc_f, dec_f, enc_e, dec_e


def test_a_bucket_costs_the_same_calls_whatever_its_tensor_count(twin):
    """One dtype: encode fixed 3 (norm lanes, norms, codes), decode fixed 1, encode Elias 9 (norm
    lanes, norms, levels, bucket bits, their scan by group, group totals, the scan of group bytes,
    write, compose),
    decode Elias 6 (the headers' group bytes and their scan, on the device instead of a read back
    of the headers; zeros, groups, sum, any-refused): the per-tensor ops' counts (3 for the Elias
    decode of one payload, + the sum, + the 2 header calls), for 1, 3 and 40 tensors. Mixed
    dtypes: the per-dtype stages once per dtype present."""
    sizes = [33, 8 * 129 + 1, 70_001, 7]
    counts = {t: _bucket_calls(twin, _grads([sizes[i % 4] for i in range(t)], [torch.float32])) for t in (1, 3, 40)}
    assert set(counts.values()) == {(3, 1, 9, 6)}, counts
    for t in (4, 40):
        mixed = _bucket_calls(twin, _grads([sizes[i % 4] for i in range(t)], DTYPES))
        assert mixed == (3 * 4, 1 * 4, 3 * 4 + 6, 3 * 4 + 3), (t, mixed)
    assert _bucket_calls(twin, _grads([0, 0], [torch.float32])) == (0, 0, 0, 0)


# -- refusals -----------------------------------------------------------------------------------

def test_refusals_name_the_problem(twin):
    xs = [torch.randn(40), torch.randn(9, dtype=torch.float64)]
    gb = group_buckets(8)
    for op, extra in ((twin.qsgd_encode_fixed_many, ()), (twin.qsgd_encode_elias_many, (gb,))):
        with pytest.raises(RuntimeError, match="2 tensors but 1 keys"):
            op(xs, 15, 8, False, [1], *extra)
        with pytest.raises(RuntimeError, match="tensor 1 is on meta, tensor 0 on cpu"):
            op([xs[0], torch.empty(3, device="meta")], 15, 8, False, [1, 2], *extra)
        with pytest.raises(RuntimeError, match="levels must be in"):
            op(xs, 0, 8, False, [1, 2], *extra)
        with pytest.raises(RuntimeError, match="must be fp16, bf16, fp32 or fp64"):
            op([xs[0], torch.arange(3)], 15, 8, False, [1, 2], *extra)
    norms, packed = twin.qsgd_encode_fixed_many(xs, 15, 8, False, [1, 2])
    with pytest.raises(RuntimeError, match="tensor 1 has 2 payloads, tensor 0 has 1"):
        twin.qsgd_decode_fixed_many([norms[0], norms[1].expand(2, -1)], [packed[0], packed[1].expand(2, -1)],
                                    [40, 9], 15, 8, [torch.float32, torch.float64], 1.0, [None, None])
    with pytest.raises(RuntimeError, match="one entry per tensor"):
        twin.qsgd_decode_fixed_many(norms, packed[:1], [40, 9], 15, 8, [torch.float32] * 2, 1.0, [None, None])
    with pytest.raises(RuntimeError, match="qsgd_decode: expected 5 norms, got 2"):  # the per-tensor message
        twin.qsgd_decode_fixed_many([norms[1], norms[1]], packed, [40, 9], 15, 8, [torch.float32] * 2, 1.0,
                                    [None, None])
    en, eb, es = twin.qsgd_encode_elias_many(xs, 15, 8, False, [1, 2], gb)
    dts = [torch.float32, torch.float64]
    with pytest.raises(RuntimeError, match="tensor 1 has 2 payloads, tensor 0 has 1"):
        twin.qsgd_decode_elias_many([[en[0]], [en[1]] * 2], [[eb[0]], [eb[1]] * 2], [[es[0]], [es[1]] * 2], [40, 9],
                                    15, 8, gb, dts, 1.0, [None, None])
    with pytest.raises(RuntimeError, match="tensor 0 has 1 norms, 2 nbits and 1 streams"):
        twin.qsgd_decode_elias_many([[en[0]], [en[1]]], [[eb[0]] * 2, [eb[1]]], [[es[0]], [es[1]]], [40, 9], 15, 8,
                                    gb, dts, 1.0, [None, None])
    with pytest.raises(RuntimeError, match="one entry per tensor"):
        twin.qsgd_decode_elias_many([[en[0]], [en[1]]], [[eb[0]], [eb[1]]], [[es[0]]], [40, 9], 15, 8, gb, dts, 1.0,
                                    [None, None])
    with pytest.raises(RuntimeError, match="tensor 0 has no payloads"):
        twin.qsgd_decode_elias_many([[]], [[]], [[]], [40], 15, 8, gb, dts[:1], 1.0, [None])


def _malformed_cases(stream, nbits):
    gen = torch.Generator().manual_seed(1)
    cases = [("zeroed", nbits, torch.zeros_like(stream)), ("ones", nbits, torch.full_like(stream, 255)),
             ("random", nbits, torch.randint(0, 256, stream.shape, generator=gen, dtype=torch.uint8))]
    for pos in range(0, stream.numel(), max(1, stream.numel() // 40)):
        f = stream.clone()
        f[pos] ^= 0x10
        cases.append((f"bit flip at {pos}", nbits, f))
    shifted = nbits.clone()
    shifted[0] += 8
    shifted[1] -= 8
    cases.append(("counts shifted", shifted, stream))
    neg = nbits.clone()
    neg[1] = -1
    cases.append(("negative count", neg, stream))
    short = stream[:-1]
    cases.append(("short stream", nbits, short))
    return cases


def test_elias_malformed_payloads_refused_like_the_per_tensor_op(twin):
    """A bucket of three tensors, K = 2, the second payload of its middle tensor corrupted: the
    bucket op raises what the per-tensor op raises for that payload (header or stream), and where
    that op accepts the payload, the bucket's mean is the per-tensor path's."""
    n, s, d = [33, 70_001, 7], 7, 16
    gb = group_buckets(d)  # two groups in the middle tensor
    xs = _grads(n, [torch.float32], seed=9)
    en, eb, es = twin.qsgd_encode_elias_many(xs, s, d, False, _keys(3), gb)
    dts = [torch.float32] * 3
    codec = QSGDCodec(impl="twin", levels=s, bucket=d, coding="elias")
    refused = 0
    for name, nb, st in _malformed_cases(es[1], eb[1]):
        want = outcome(twin.qsgd_decode_elias, en[1], nb, st, n[1], s, d, gb, torch.float32)
        norms, nbits, streams = [[t, t] for t in en], [[t, t] for t in eb], [[t, t] for t in es]
        nbits[1][1], streams[1][1] = nb, st
        got = outcome(twin.qsgd_decode_elias_many, norms, nbits, streams, n, s, d, gb, dts, 0.5, [None] * 3)
        assert got == want, f"{name}: bucket {got} vs per-tensor {want}"
        refused += want[0] is not None
        if want[0] is None:
            means = twin.qsgd_decode_elias_many(norms, nbits, streams, n, s, d, gb, dts, 0.5, [None] * 3)
            payloads = [[Payload({"norms": a, "nbits": b, "stream": c}, (x.numel(),), x.dtype)
                         for a, b, c in zip(norms[i], nbits[i], streams[i])] for i, x in enumerate(xs)]
            for m, w in zip(means, _mean_list(codec, payloads)):
                _same(m, w, name)
    assert refused >= 5


# -- the codec and the exchange ------------------------------------------------------------------

@pytest.mark.parametrize("coding", ["fixed", "elias"])
@pytest.mark.parametrize("norm", ["l2", "max"])
def test_codec_bucket_path_matches_native(twin, coding, norm):
    """QSGDCodec(impl="twin") takes the bucket ops; impl="native" (CPU tensors) goes tensor by
    tensor: the same payloads (keys from the stream positions), the same means, the same stream
    position afterwards."""
    opts = dict(levels=15, bucket=33, norm=norm, coding=coding, seed=5, rank_stream=2)
    tw_codec, nat = QSGDCodec(impl="twin", **opts), QSGDCodec(impl="native", **opts)
    cpu = [torch.device("cpu")]
    assert tw_codec.bucket_ops(cpu) and not nat.bucket_ops(cpu)
    assert not tw_codec.bucket_ops([torch.device("cpu"), torch.device("meta")])
    shapes = [(0,), (1,), (7,), (31,), (4, 8), (33,), (8 * 129 + 1,), (16, 3, 3, 3)]
    grads = [g.view(s) for g, s in zip(_grads([torch.Size(s).numel() for s in shapes], DTYPES, seed=4), shapes)]
    for positions in (None, [10 + 3 * i for i in range(len(grads))]):
        pt, pn = tw_codec.encode_many(grads, positions=positions), nat.encode_many(grads, positions=positions)
        assert tw_codec.counter == nat.counter
        for a, b in zip(pt, pn):
            assert a.shape == b.shape and a.dtype == b.dtype and list(a.buffers) == list(b.buffers)
            for name in a.buffers:
                _same(a.buffers[name], b.buffers[name], name)
    outs = [torch.empty_like(g) for g in grads]
    if coding == "fixed":
        stacked = [Payload({k: torch.stack([v, v, v]) for k, v in p.buffers.items()}, p.shape, p.dtype) for p in pt]
        mt = tw_codec.decode_mean_stacked_many(stacked, outs=outs)
        mn = nat.decode_mean_stacked_many(stacked)
    else:
        other = tw_codec.encode_many(grads)
        lists = [[p, q] for p, q in zip(pt, other)]
        mt = tw_codec.decode_mean_list_many(lists, outs=outs)
        mn = nat.decode_mean_list_many(lists)
    for a, b, o in zip(mt, mn, outs):
        assert a is o
        _same(a, b, "mean")
    with pytest.raises(ValueError, match="without error feedback"):
        tw_codec.encode_many(grads, residuals=[torch.zeros_like(g) for g in grads])


def test_codec_refuses_k_mismatch_and_malformed_lists(twin):
    codec = QSGDCodec(impl="twin", coding="elias", bucket=16)
    grads = _grads([40, 9], [torch.float32])
    p = codec.encode_many(grads)
    with pytest.raises(ValueError, match="one K ranks"):
        codec.decode_mean_list_many([[p[0]], [p[1], p[1]]])
    with pytest.raises(ValueError, match="needs at least one payload"):
        codec.decode_mean_list_many([[p[0]], []])
    fixed = QSGDCodec(impl="twin", bucket=16)
    q = fixed.encode_many(grads)
    stacked = [Payload({k: torch.stack([v] * (i + 1)) for k, v in x.buffers.items()}, x.shape, x.dtype)
               for i, x in enumerate(q)]
    with pytest.raises(ValueError, match="one K ranks"):
        fixed.decode_mean_stacked_many(stacked)


@pytest.mark.parametrize("coding", ["fixed", "elias"])
def test_a_one_rank_exchange_through_the_bucket_ops_matches_native(twin, coding):
    """A whole step through the engine (allgather pattern, memory.encode_many, the bucket decode):
    impl="twin" gives impl="native"'s results bitwise over three steps, in one bucket encode and
    one bucket decode (fixed: 3 + 1 device calls; Elias: 9 + 6)."""
    shapes = {"a": (300, 40), "b": (77,), "c": (16, 3, 3, 3), "d": (1,), "e": (33,)}
    named = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in shapes.items()]
    comps = {impl: hgc.Compression.codec("qsgd", named, communicator=OneRank(), impl=impl, pattern="allgather",
                                         coding=coding, bucket=64, seed=3)
             for impl in ("twin", "native")}
    for step in range(3):
        sizes = [torch.Size(s).numel() for s in shapes.values()]
        grads = {n: g.view(s) for (n, s), g in zip(shapes.items(), _grads(sizes, [torch.float32], seed=20 + step))}
        out = {"native": comps["native"].exchange({n: g.clone() for n, g in grads.items()})}
        calls = device_calls(twin, lambda: out.__setitem__("twin", comps["twin"].exchange(dict(grads))))
        assert calls == (3 + 1 if coding == "fixed" else 9 + 6), calls
        for n in shapes:
            _same(out["twin"][n], out["native"][n], f"step {step} {n}")
