"""onebit's ``residual_cap``: after the error-feedback update each group's residual is scaled down
to at most ``cap`` times the same group's gradient norm; the payload is the uncapped encode's.

The oracle is written here in plain torch, group by group in Python loops (float64): the uncapped
encode's residual ``v - decode(payload)``, then each group (a row in rows mode, a column in
columns mode, the whole 1-D tensor) multiplied by ``min(1, cap * |g_j| / |r_j|)``. Every impl,
both modes, the bucket ops and the column windows of the two-phase pattern are held to it.
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.native import native_available

pytestmark = pytest.mark.timeout(120)

IMPLS = ["reference"] + (["native"] if native_available() else [])
SHAPES = [(6, 10), (12, 5), (4, 3, 3), (17,), (0,)]


def _data(shape, seed, residual_scale=4.0):
    """(g, r): seeded float64 values; r several times g, so most groups are over a cap of 1."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    r = torch.randn(shape, generator=gen, dtype=torch.float64) * residual_scale
    if g.dim() >= 2:
        g[1] = 0  # a row whose gradient is all zero: its residual must become zero (rows mode)
    return g, r


def _groups_of(t, scales):
    """The groups of ``t`` as a list of 1-D views: rows of [d0, -1], columns of it, or the whole 1-D tensor."""
    if t.dim() < 2:
        return [t.view(-1)]
    grid = t.view(t.shape[0], -1)
    return [grid[i] for i in range(grid.shape[0])] if scales == "rows" else [grid[:, j] for j in range(grid.shape[1])]


def _oracle(g, r, scales, cap):
    """(payload of the uncapped encode, the capped residual), computed group by group."""
    plain = hgc.get_codec("onebit", impl="reference", scales=scales)
    res = r.clone()
    payload = plain.encode(g, residual=res)
    for rg, gg in zip(_groups_of(res, scales), _groups_of(g, scales)):
        rn, limit = float(rg.norm()), cap * float(gg.norm())
        if rn > limit:
            rg.mul_(limit / rn)
    return payload, res


def _same_payload(a, b):
    assert torch.equal(a.buffers["bits"], b.buffers["bits"])
    torch.testing.assert_close(a.buffers["scales"], b.buffers["scales"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scales", ["rows", "columns"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cap", [0.5, 1.0, 3.0])
def test_encode_caps_each_group(impl, scales, shape, cap):
    g, r = _data(shape, seed=len(shape) * 10 + int(cap * 2))
    want_payload, want_residual = _oracle(g, r, scales, cap)
    codec = hgc.get_codec("onebit", impl=impl, scales=scales, residual_cap=cap)
    res = r.clone()
    payload = codec.encode(g, residual=res)
    _same_payload(payload, want_payload)
    torch.testing.assert_close(res, want_residual, rtol=1e-9, atol=1e-12)
    for rg, gg in zip(_groups_of(res, scales), _groups_of(g, scales)):
        assert float(rg.norm()) <= cap * float(gg.norm()) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("impl", IMPLS)
def test_groups_within_the_cap_are_untouched(impl):
    g, r = _data((8, 6), seed=3, residual_scale=0.01)
    g[1] = torch.randn(6, dtype=torch.float64)
    plain = hgc.get_codec("onebit", impl=impl)
    capped = hgc.get_codec("onebit", impl=impl, residual_cap=2.0)
    r1, r2 = r.clone(), r.clone()
    plain.encode(g, residual=r1)
    capped.encode(g, residual=r2)
    assert torch.equal(r1, r2)  # one step of error feedback leaves at most |v| <= |g| + |r| here


@pytest.mark.parametrize("scales", ["rows", "columns"])
def test_bucket_ops_match_encode(scales):
    if not native_available():
        pytest.skip("the bucket ops are native")
    codec = hgc.get_codec("onebit", scales=scales, residual_cap=1.0)
    data = [_data(s, seed=i) for i, s in enumerate(SHAPES)]
    one = [r.clone() for _, r in data]
    payloads = [codec.encode(g, residual=r) for (g, _), r in zip(data, one)]
    many = [r.clone() for _, r in data]
    bucket = codec.encode_many([g for g, _ in data], many)
    for a, b, ra, rb in zip(payloads, bucket, one, many):
        _same_payload(a, b)
        assert torch.equal(ra, rb)


def test_column_windows_match_the_whole_tensor():
    if not native_available():
        pytest.skip("the column windows are native")
    codec = hgc.get_codec("onebit", scales="columns", residual_cap=1.0)
    g, r = _data((7, 12), seed=5)
    whole = r.clone()
    codec.encode(g, residual=whole)
    windows = r.clone()
    for start, stop in [(0, 5), (5, 9), (9, 12)]:
        codec.encode_columns(g, windows, start, stop)
    torch.testing.assert_close(windows, whole, rtol=1e-12, atol=0)
    windows = r.clone()
    codec.encode_columns_many([(g, windows, 0, 6), (g, windows, 6, 12)])
    torch.testing.assert_close(windows, whole, rtol=1e-12, atol=0)


def test_float16_residual():
    g, r = (t.to(torch.float16) for t in _data((5, 8), seed=9))
    codec = hgc.get_codec("onebit", impl="reference", residual_cap=1.0)
    codec.encode(g, residual=r)
    assert r.dtype == torch.float16
    for rg, gg in zip(_groups_of(r.float(), "rows"), _groups_of(g.float(), "rows")):
        assert float(rg.norm()) <= float(gg.norm()) * 1.01 + 1e-6


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1"])
def test_bad_caps_are_refused(bad):
    with pytest.raises(ValueError, match="onebit: residual_cap must be a finite number >= 0"):
        hgc.get_codec("onebit", impl="reference", residual_cap=bad)


def test_repr_names_the_cap():
    assert "residual_cap=1.5" in repr(hgc.get_codec("onebit", impl="reference", residual_cap=1.5))
    assert "residual_cap" not in repr(hgc.get_codec("onebit", impl="reference"))
