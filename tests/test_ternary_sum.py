"""The two-phase owner's exact sum of K TernGrad payloads (codecs/ternary_sum.py).

Its decode must be bitwise what TernGrad's own decode_mean_stacked of the K payloads gives
(the allgather's result), for every field width, dtype and size; it refuses payloads whose
scales differ and a K it was not made for."""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload
from horovod_gradcomp.codecs.ternary_sum import MAX_K, TernarySumCodec, level_width
from horovod_gradcomp.native import native_available

IMPLS = ["reference"] + (["native"] if native_available() else [])
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def stacked_payloads(k, n, dtype, impl, seed=0):
    """K TernGrad payloads of n values with one shared scale, stacked as an owner receives them."""
    gen = torch.Generator().manual_seed(seed)
    codecs = [hgc.get_codec("terngrad", impl=impl, rank_stream=r, seed=seed) for r in range(k)]
    xs = [torch.randn(n, generator=gen, dtype=torch.float64).to(dtype) for _ in range(k)]
    scale = max(c.local_scale(x) for c, x in zip(codecs, xs))
    payloads = [c.encode(x, scale=scale) for c, x in zip(codecs, xs)]
    stacked = Payload({b: torch.stack([p.buffers[b] for p in payloads]) for b in payloads[0].buffers},
                      payloads[0].shape, dtype, payloads[0].device)
    return codecs[0], stacked


def test_level_width():
    assert [level_width(k) for k in (1, 7, 8, 127, 128, MAX_K)] == [4, 4, 8, 8, 16, 16]
    for bad in (0, MAX_K + 1):
        with pytest.raises(ValueError, match="K must be"):
            level_width(bad)
    # beyond the widest field the two-phase owners ternarize the mean again, as before exact sums
    assert hgc.get_codec("terngrad").owner_sum_codec(MAX_K) is not None
    assert hgc.get_codec("terngrad").owner_sum_codec(MAX_K + 1) is None


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 7, 8 * 1000 + 1])
@pytest.mark.parametrize("k", [1, 2, 4, 7, 8, 130])
def test_decode_is_the_mean_of_the_payloads(impl, dtype, n, k):
    ternary, stacked = stacked_payloads(k, n, dtype, impl, seed=k + n)
    want = ternary.decode_mean_stacked(stacked)
    summed = ternary.owner_sum_codec(k)
    assert isinstance(summed, TernarySumCodec) and summed.k == k and summed.impl == impl
    payload = summed.encode_stacked(ternary, stacked)
    assert payload.nbytes == summed.payload_nbytes((n,), dtype) == (n * summed.width + 7) // 8 + 4
    got = summed.decode(payload)
    assert got.dtype == dtype and got.shape == (n,)
    assert torch.equal(got, want)
    out = torch.full((n,), 7.0, dtype=dtype)
    assert summed.decode(payload, out=out) is out and torch.equal(out, want)


def test_levels_are_the_biased_integer_sums():
    """K=3: the sums of three ternary values in -3..3 stored as 0..6, two per byte."""
    ternary, stacked = stacked_payloads(3, 9, torch.float32, "reference", seed=5)
    values = torch.stack([ternary.decode(Payload({b: v[i] for b, v in stacked.buffers.items()}, stacked.shape,
                                                 stacked.dtype, stacked.device)) for i in range(3)])
    s = stacked.buffers["scale"][0, 0].item()
    sums = torch.round(values.double().sum(0) / s).to(torch.int64) if s else torch.zeros(9, dtype=torch.int64)
    payload = TernarySumCodec(3, "reference").encode_stacked(ternary, stacked)
    levels = payload.buffers["levels"]
    fields = torch.stack([levels & 15, levels >> 4], 1).reshape(-1)[:9].to(torch.int64)
    assert torch.equal(fields - 3, sums)
    assert payload.buffers["scale"].item() == s


def test_refuses_unshared_scales_and_wrong_k():
    ternary, stacked = stacked_payloads(2, 10, torch.float32, "reference")
    with pytest.raises(ValueError, match="payloads for a sum over K=3"):
        TernarySumCodec(3, "reference").encode_stacked(ternary, stacked)
    stacked.buffers["scale"][1, 0] *= 2
    with pytest.raises(ValueError, match="different scales"):
        TernarySumCodec(2, "reference").encode_stacked(ternary, stacked)
    with pytest.raises(NotImplementedError, match="encode_stacked"):
        TernarySumCodec(2).encode(torch.zeros(3))


@pytest.mark.skipif(not native_available(), reason="native extension not built")
@pytest.mark.parametrize("k", [4, 100, 300])
def test_native_matches_reference_on_any_thread_split(k):
    """Thread ranges may start in the middle of a byte of 4-bit fields: same bytes and values
    with 1 and 3 threads, and as the torch-ops reference."""
    ternary, stacked = stacked_payloads(k, 100_003, torch.float32, "native", seed=k)
    ref = TernarySumCodec(k, "reference")
    want_payload = ref.encode_stacked(ternary, stacked)
    want = ref.decode(want_payload)
    threads = torch.get_num_threads()
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            native = TernarySumCodec(k, "native")
            payload = native.encode_stacked(ternary, stacked)
            assert torch.equal(payload.buffers["levels"], want_payload.buffers["levels"])
            assert torch.equal(native.decode(payload), want)
    finally:
        torch.set_num_threads(threads)
