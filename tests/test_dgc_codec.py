"""The dgc codec's contract: the native selection is a magnitude threshold set of about
density*n values (count within [k/2, 2k], or exact), the reference is the exact top-k,
density 1 is lossless, decode_mean_list is the scaled sum of the scattered payloads, exact
payload sizes, options and errors."""
from __future__ import annotations

import math

import pytest
import torch

from horovod_gradcomp.codecs import get_codec
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.codecs.dgc import target_count
from horovod_gradcomp.native import native_available

pytestmark = pytest.mark.timeout(120)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SIZES = [0, 1, 7, 8 * 1024 + 1]
IMPLS = ["native", "reference"]
dt_id = lambda d: str(d).replace("torch.", "")  # noqa: E731

needs_native = pytest.mark.skipif(not native_available(), reason="native extension not built")


def _impls():
    return [pytest.param(i, marks=needs_native) if i == "native" else i for i in IMPLS]


def _grad(n, dtype, seed=0, shape=None):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=gen, dtype=torch.float64) * torch.exp(torch.randn(n, generator=gen,
                                                                                    dtype=torch.float64))
    return t.to(dtype).view(shape if shape is not None else (n,))


def _sparse(x, idx, vals):
    """Dense tensor with vals at idx (the 'sparse version' the payload stands for)."""
    y = torch.zeros(x.numel(), dtype=x.dtype)
    y[idx.long()] = vals
    return y.view(x.shape)


def index_code_width(idx):
    """Bytes per index of the compact code, computed independently of the codec: 1 or 2 when
    every gap code (idx_j - idx_{j-1} - 1, idx_{-1} = -1) fits, else 4."""
    if idx.numel() == 0:
        return 0
    prev = torch.cat([torch.tensor([-1]), idx.long()[:-1]])
    top = int((idx.long() - prev - 1).max())
    return 1 if top < 256 else 2 if top < 65536 else 4


def _check_threshold_set(x, idx, vals, t):
    mag = x.reshape(-1).double().abs()
    want = torch.nonzero(mag >= t).view(-1)
    assert torch.equal(idx.long(), want)
    assert torch.equal(vals, x.reshape(-1)[want])


# -- native selection -------------------------------------------------------------------------

@needs_native
@pytest.mark.parametrize("n", [100_000, 1_000_003])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.1])
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_native_threshold_set(dtype, density, n):
    x = _grad(n, dtype, seed=n)
    c = get_codec("dgc", density=density, seed=5, rank_stream=1)
    k = target_count(n, density)
    for _ in range(3):
        idx, vals, t = c.select(x, return_threshold=True)
        assert idx.dtype == torch.int32 and vals.dtype == dtype
        _check_threshold_set(x, idx, vals, t)
        cnt = idx.numel()
        # the documented tolerance: within 2x of k (for continuous data the exact paths hit k,
        # up to ties, which low-precision types have)
        assert k / 2 <= cnt <= 2 * k, (cnt, k, c.last_path)
        if c.last_path == 0 and dtype in (torch.float32, torch.float64):
            assert abs(cnt - k) <= 0.5 * k  # the sample estimate is good (>= 32 expected samples above)


@needs_native
@pytest.mark.parametrize("n, density", [(400_003, 0.001), (1_000_003, 0.001), (300_000, 0.01), (50_000, 0.2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dt_id)
def test_native_sampled_threshold_is_the_samples_rth_largest(dtype, density, n):
    """Path 0's threshold, from an independent computation: the places of the m samples
    (splitmix64(key + (j + 1) * golden) scaled to [0, n)), and the ceil(k m / n)-th largest of
    their magnitudes (small r: the native heap; large r, density 0.2: its nth_element)."""
    from horovod_gradcomp.codecs.dgc import sample_count
    from horovod_gradcomp.codecs.streams import mix64
    x = _grad(n, dtype, seed=n + 1)
    k, m = target_count(n, density), sample_count(n, density, 0.01)
    key = 0x1234_5678_9ABC_DEF0
    golden, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1
    places = torch.tensor([(mix64((key + (j + 1) * golden) & mask) * n) >> 64 for j in range(m)], dtype=torch.long)
    assert m > 0
    r = min(max(math.ceil(k * m / n), 1), m)
    want = x[places].abs().sort(descending=True).values[r - 1].item()
    _, _, t, path = get_codec("dgc")._C.dgc_select(x, k, m, key - (1 << 64) if key >> 63 else key)
    assert path == 0, "continuous data: the sampled threshold is accepted"
    assert t == want


@needs_native
def test_native_paths_and_stream():
    n = 400_000
    x = _grad(n, torch.float32, seed=1)
    c = get_codec("dgc", density=0.01)
    c.select(x)
    assert c.last_path == 0
    # the counter-based stream: same position, same selection; rank streams differ
    c.reset_stream(7)
    a = c.select(x)
    c.reset_stream(7)
    b = c.select(x)
    assert torch.equal(a[0], b[0])
    # fewer nonzeros than k/2: the sample's threshold is the smallest positive value, the count
    # too low -> exact selection of every nonzero
    z = torch.zeros(n)
    z[::400] = torch.randn(n // 400)
    i, v, t = c.select(z, return_threshold=True)
    _check_threshold_set(z, i, v, t)
    assert i.numel() == n // 400 and c.last_path == 2
    # many ties just below the top: the sample's threshold selects far too many -> refined
    # among the candidates (path 1) to the exact k-th largest
    w = torch.ones(n)
    w[torch.randperm(n, generator=torch.Generator().manual_seed(0))[:5000]] = 2.0
    w[:10] = 3.0
    seen = set()
    for pos in range(20):
        c.reset_stream(pos)
        i, v, t = c.select(w, return_threshold=True)
        _check_threshold_set(w, i, v, t)
        seen.add(c.last_path)
        assert t == 2.0 and i.numel() == int((w >= 2).sum())
    assert seen <= {0, 1}
    # all tied: everything is at the threshold, all selected (documented)
    y = torch.ones(n)
    i, v, t = c.select(y, return_threshold=True)
    assert t == 1.0 and i.numel() == n  # all tied at the threshold: all selected (documented)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_native_exact_small_matches_topk(dtype):
    # small tensors take the exact path: the k largest magnitudes (continuous data: no ties)
    x = _grad(5000, torch.float64, seed=3).to(dtype)
    c = get_codec("dgc", density=0.01)
    idx, vals, t = c.select(x, return_threshold=True)
    assert c.last_path == 2
    _check_threshold_set(x, idx, vals, t)
    k = target_count(5000, 0.01)
    kth = x.double().abs().sort(descending=True).values[k - 1].item()
    assert t == kth and idx.numel() >= k


@needs_native
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("n, density", [(2, 0.5), (7, 0.001), (7, 0.3), (100, 0.05), (4096, 0.001),
                                        (20_000, 0.01), (200_000, 0.001)])
def test_native_exact_path_threshold_is_kth_largest(dtype, n, density):
    """The exact path (radix select) against a full sort, with zeros and repeated values."""
    x = _grad(n, torch.float64, seed=n).to(dtype)
    x[::5] = 0
    x[1::7] = x[1]
    c = get_codec("dgc", density=density)
    idx, vals, t = c.select(x, return_threshold=True)
    assert c.last_path == 2
    _check_threshold_set(x, idx, vals, t)
    mags = x.double().abs().sort(descending=True).values
    k = target_count(n, density)
    nnz = int((mags > 0).sum())
    if nnz <= k:
        assert idx.numel() == nnz
    else:
        assert t == mags[k - 1].item()


# -- reference --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("n", SIZES + [100_000])
def test_reference_is_exact_topk(n, dtype):
    x = _grad(n, torch.float64, seed=n).to(dtype)
    c = get_codec("dgc", impl="reference", density=0.01)
    idx, vals, t = c.select(x, return_threshold=True)
    k = target_count(n, 0.01)
    assert idx.numel() == k
    assert torch.equal(idx.long(), torch.sort(torch.topk(x.double().abs(), k).indices).values)
    assert torch.equal(vals, x[idx.long()])
    if n:
        # native and reference select the same set when there are no ties
        if native_available() and x.double().abs().unique().numel() == n:
            i2, v2 = get_codec("dgc", density=0.01, sample=0.5).select(x)
            if i2.numel() == k:
                assert torch.equal(i2, idx)


# -- lossless at density 1, sizes, dtypes, shapes ---------------------------------------------------

@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_density_one_is_lossless(dtype, n, impl):
    shape = (n,) if n != 8 * 1024 + 1 else (1, 8193, 1)
    x = _grad(n, dtype, seed=n, shape=shape)
    c = get_codec("dgc", impl=impl, density=1.0)
    p = c.encode(x)
    y = c.decode(p)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.equal(y, x)
    nnz = int((x != 0).sum())
    assert p.buffers["values"].numel() == nnz and c.indices_of(p).numel() == nnz
    assert p.nbytes == nnz * (index_code_width(c.indices_of(p)) + x.element_size())
    out = torch.empty_like(x)
    assert c.decode(p, out=out) is out and torch.equal(out, x)


@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_sizes_and_nbytes(dtype, n, impl):
    x = _grad(n, dtype, seed=n + 1)
    c = get_codec("dgc", impl=impl, density=0.001)
    p = c.encode(x)
    assert list(p.buffers) == ["indices", "values"]
    idx = c.indices_of(p)
    cnt = idx.numel()
    assert p.buffers["indices"].dtype == torch.uint8 and idx.dtype == torch.int32
    assert p.buffers["values"].dtype == dtype and p.buffers["values"].numel() == cnt
    k = 0 if n == 0 else target_count(n, 0.001)
    if impl == "reference" or x.double().abs().unique().numel() == n:
        assert cnt == k  # exact path (small tensor), no ties
    else:
        assert cnt >= k  # ties at the threshold (low precision) are all selected
    assert p.nbytes == index_code_width(idx) * cnt + cnt * x.element_size()
    assert torch.equal(c.decode(p), _sparse(x, idx, p.buffers["values"]))
    assert torch.equal(c.selected_indices(p), idx.long())
    again, selected = c.encode_with_indices(x)  # the indices as selected == those the code carries
    assert torch.equal(selected, c.indices_of(again))


@pytest.mark.parametrize("impl", _impls())
def test_all_zero_selects_nothing(impl):
    c = get_codec("dgc", impl=impl, density=0.01)
    for n in (1, 7, 8193, 200_000):
        p = c.encode(torch.zeros(n))
        assert p.buffers["values"].numel() == 0 and p.nbytes == 0
        assert torch.equal(c.decode(p), torch.zeros(n))
    # fewer nonzeros than k: all of them, no zeros
    x = torch.zeros(200_000)
    x[[3, 77, 150_000]] = torch.tensor([1.0, -2.0, 0.5])
    idx, vals = c.select(x)
    assert idx.tolist() == [3, 77, 150_000] and vals.tolist() == [1.0, -2.0, 0.5]


@needs_native
def test_nan_is_selected():
    x = _grad(100_000, torch.float32)
    x[1234] = float("nan")
    for impl in IMPLS:
        idx, _ = get_codec("dgc", impl=impl, density=0.001).select(x)
        assert 1234 in idx.tolist()


# -- decode_mean_list ------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_decode_many_is_mean_of_sparse(dtype, impl):
    n = 300_001
    xs = [_grad(n, dtype, seed=s) for s in range(3)] + [torch.zeros(n, dtype=dtype)]  # rank 3 sends nothing
    xs[1][:1000] = 0  # overlapping and disjoint supports
    c = get_codec("dgc", impl=impl, density=0.01)
    pays = [c.encode(x) for x in xs]
    assert pays[3].buffers["values"].numel() == 0
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    want = sum(_sparse(x, c.indices_of(p), p.buffers["values"]).to(acc) for x, p in zip(xs, pays))
    got = c.decode_mean_list(pays)
    assert got.dtype == dtype
    assert torch.equal(got, (want * (1.0 / 4)).to(dtype))
    # matches the base class's loop bit for bit, with a custom scale and out=
    base = super(type(c), c).decode_mean_list(pays, 0.5)
    out = torch.empty(n, dtype=dtype)
    assert c.decode_mean_list(pays, 0.5, out=out) is out and torch.equal(out, base)
    # native and reference decoders agree on the same payloads
    if native_available():
        ref = get_codec("dgc", impl="reference").decode_mean_list(pays, 0.5)
        assert torch.equal(ref, base)


def _abs_code(idx):
    """Index code holding the int32 indices themselves (w = 4)."""
    return torch.tensor(idx, dtype=torch.int32).view(torch.uint8)


@pytest.mark.parametrize("impl", _impls())
def test_decode_validates(impl):
    c = get_codec("dgc", impl=impl)
    err = RuntimeError if impl == "native" else ValueError
    good = Payload({"indices": torch.tensor([1, 3], dtype=torch.uint8), "values": torch.ones(2)},
                   torch.Size([8]), torch.float32)  # gaps 2 and 4: indices 1 and 5
    assert c.decode(good).tolist() == [0, 1, 0, 0, 0, 1, 0, 0]
    assert c.decode(Payload({"indices": _abs_code([1, 5]), "values": torch.ones(2)}, torch.Size([8]),
                            torch.float32)).tolist() == [0, 1, 0, 0, 0, 1, 0, 0]
    for idx in ([5, 1], [1, 1], [1, 8], [-1, 2]):
        bad = Payload({"indices": _abs_code(idx), "values": torch.ones(2)}, torch.Size([8]), torch.float32)
        with pytest.raises(err, match="strictly increasing"):
            c.decode(bad)
    with pytest.raises(err, match="strictly increasing"):  # gap codes running past n
        c.decode(Payload({"indices": torch.tensor([1, 6], dtype=torch.uint8), "values": torch.ones(2)},
                         torch.Size([8]), torch.float32))
    with pytest.raises(err, match="bytes of index code"):  # 3 bytes for 2 values
        c.decode(Payload({"indices": torch.tensor([1, 3, 0], dtype=torch.uint8), "values": torch.ones(2)},
                         torch.Size([8]), torch.float32))
    with pytest.raises(ValueError):
        c.decode(Payload({"indices": torch.tensor([1], dtype=torch.int64), "values": torch.ones(1)},
                         torch.Size([8]), torch.float32))
    with pytest.raises(ValueError):
        c.decode(good, out=torch.empty(8, dtype=torch.float64))
    with pytest.raises(ValueError):
        c.decode_mean_list([])


# -- index coding -----------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("idx, n, width", [
    ([], 10, 0), ([0], 1, 1), ([255], 300, 1), ([256], 300, 2), ([3, 259, 65795], 70_000, 2),
    ([0, 65537], 70_000, 4), ([5, 6, 7, 100_000], 200_000, 4), ([2**31 - 5], 2**31 - 1, 4)])
def test_index_code_widths_and_round_trip(impl, idx, n, width):
    c = get_codec("dgc", impl=impl)
    ix = torch.tensor(idx, dtype=torch.int32)
    p = Payload({"indices": torch.zeros(0, dtype=torch.uint8), "values": torch.ones(len(idx))}, torch.Size([n]),
                torch.float32)
    from horovod_gradcomp.codecs.dgc import reference_index_encode
    code = c._C.dgc_index_encode(ix, n) if impl == "native" else reference_index_encode(ix, n)
    assert code.dtype == torch.uint8 and code.numel() == width * len(idx)
    if width in (1, 2):  # little-endian gap codes, by hand
        gaps = [i - j - 1 for i, j in zip(idx, [-1] + idx[:-1])]
        want = [b for g in gaps for b in ((g,) if width == 1 else (g & 255, g >> 8))]
        assert code.tolist() == want
    p.buffers["indices"] = code
    assert c.indices_of(p).tolist() == idx


@needs_native
@pytest.mark.parametrize("density", [0.3, 0.01, 0.001, 0.00001])
def test_native_and_reference_index_codes_agree(density):
    x = _grad(1_000_003, torch.float32, seed=7)
    idx, _ = get_codec("dgc", impl="reference", density=density).select(x)
    from horovod_gradcomp.codecs.dgc import reference_index_encode
    native = get_codec("dgc")._C.dgc_index_encode(idx, x.numel())
    assert torch.equal(native, reference_index_encode(idx, x.numel()))
    assert native.numel() == index_code_width(idx) * idx.numel()


@needs_native
def test_index_code_is_two_bytes_at_density_0001():
    c = get_codec("dgc", density=0.001)
    p = c.encode(_grad(1_000_003, torch.float32, seed=2))
    cnt = p.buffers["values"].numel()
    assert p.buffers["indices"].numel() == 2 * cnt and p.nbytes == 6 * cnt


# -- options and errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(density=0), dict(density=1.5), dict(density=-0.1), dict(density=True),
                                dict(density="0.1"), dict(sample=0), dict(sample=2.0), dict(seed=1.5),
                                dict(rank_stream="a"), dict(impl="fast")])
def test_bad_options(kw):
    with pytest.raises(ValueError):
        get_codec("dgc", **kw)


@pytest.mark.parametrize("impl", _impls())
def test_errors(impl):
    c = get_codec("dgc", impl=impl)
    with pytest.raises(TypeError):
        c.encode(torch.arange(10))
    with pytest.raises(ValueError):
        c.encode(torch.randn(10), residual=torch.zeros(10))
    with pytest.raises(NotImplementedError):
        c.layout((10,), torch.float32)
    assert c.variable_size and not c.fuses_feedback


def test_options_repr_and_agreement():
    a = get_codec("dgc", impl="reference", density=0.01, rank_stream=0)
    b = get_codec("dgc", impl="reference", density=0.01, rank_stream=3)
    assert a.agreement_key() == b.agreement_key() and "density=0.01" in repr(a)
    assert target_count(30, 0.1) == 3 and target_count(1000, 0.001) == 1 and target_count(7, 0.001) == 1
    assert target_count(1, 1.0) == 1 and target_count(0, 0.5) == 0 and target_count(10, 0.25) == 3
    assert math.isinf(a.select(torch.zeros(0), return_threshold=True)[2])
