"""The index math of the multi-tensor stages (csrc/device/multi_tensor.cuh, issue 32 item 3):
a stage runs with 32-bit positions when its padded position count fits ``index32_limit()``
(default 2**31 - 1), with 64-bit ones otherwise. The twin's ``set_index32_limit`` lowers the
limit so that the 64-bit branch runs on small buckets: every bucket op then gives the bytes of
the 32-bit branch and of the CPU kernels, and ``stage_runs()`` says which branch ran. The limit's
boundary is exact (a stage of 2**16 positions is 32-bit at a limit of 2**16, 64-bit below).
"""
from __future__ import annotations

import functools

import pytest
import torch

from horovod_gradcomp.native import require_native, require_twin
from horovod_gradcomp.ops import DTYPE_CODES
from op_samples import samples

# Sizes with several chunks per tensor and partial last chunks (a stage's chunk size is a
# power of two chosen from its counts), an empty tensor and one of one value.
SIZES = [7, 65, 0, 1, 9_001]
BUCKET_OPS = [
    "terngrad_scale_stats_many", "terngrad_encode_many", "terngrad_decode_sum_many",
    "onebit_scales_many", "onebit_encode_many", "onebit_decode_sum_many", "onebit_encode_columns_many",
    "onebit_decode_columns_many", "qsgd_encode_fixed_many", "qsgd_decode_fixed_many", "qsgd_encode_elias_many",
    "qsgd_decode_elias_many", "dgc_accumulate_many", "dgc_mask_many", "dgc_select_many", "dgc_index_encode_many",
    "dgc_scatter_sum_many", "dgc_decode_sum_many",
]


@pytest.fixture
def twin():
    """The twin (and the CPU kernels, torch.ops.hgc), its index limit restored after the test."""
    require_native()
    tw = require_twin()
    saved = tw.index32_limit()
    yield tw
    tw.set_index32_limit(saved)


@functools.lru_cache(maxsize=None)
def _samples(namespace, dtype, n):
    return samples(namespace, dtype, n)


def _fresh(value):
    """A copy of an argument with every tensor cloned (some ops write into their arguments)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_fresh(v) for v in value]
    return value


def _bucket(namespace, name, dtype):
    """Arguments of bucket op ``name`` over SIZES: each tensor's sample arguments from
    tests/op_samples.py, concatenated list by list, as fresh tensors on every call."""
    per = [_samples(namespace, dtype, n)[name] for n in SIZES]
    args = []
    for j, first in enumerate(per[0]):
        args.append(_fresh([x for p in per for x in p[j]] if isinstance(first, list) else first))
    return tuple(args)


def _tensors(value):
    """Every tensor of a (nested) result or argument tuple, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _run(namespace, name, dtype):
    """The op's results and its arguments after the call (those it writes into included), as tensors."""
    args = _bucket(namespace, name, dtype)
    out = getattr(getattr(torch.ops, namespace), name)(*args)
    return _tensors(out) + _tensors(args)


def _same(a, b, what):
    assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} tensors"
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = x.reshape(-1).contiguous(), y.reshape(-1).contiguous()
        assert x.dtype == y.dtype and x.numel() == y.numel(), f"{what}, tensor {i}: {x.dtype}[{x.numel()}] vs {y.dtype}[{y.numel()}]"
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{what}, tensor {i}: bytes differ"


def _runs(tw, fn):
    """(32-bit, 64-bit) stage runs of fn()."""
    n0, w0 = tw.stage_runs()
    fn()
    n1, w1 = tw.stage_runs()
    return n1 - n0, w1 - w0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", BUCKET_OPS)
def test_64bit_index_math_gives_the_same_bytes(twin, name, dtype):
    got = {}
    narrow = _runs(twin, lambda: got.update(narrow=_run("hgc_twin", name, dtype)))
    assert narrow[0] > 0 and narrow[1] == 0, f"{name} at the default limit: (32-bit, 64-bit) stage runs {narrow}"
    twin.set_index32_limit(0)
    wide = _runs(twin, lambda: got.update(wide=_run("hgc_twin", name, dtype)))
    assert wide[0] == 0 and wide[1] == narrow[0], f"{name} at limit 0: (32-bit, 64-bit) stage runs {wide}"
    _same(got["wide"], got["narrow"], f"{name}: 64-bit vs 32-bit index math")
    _same(got["wide"], _run("hgc", name, dtype), f"{name}: 64-bit index math vs the CPU kernels")


def test_the_limit_is_exact_at_its_boundary(twin):
    """onebit's bucket decode of one tensor of 8 * 2**16 values: one stage of 2**16 positions
    (one chunk of 2**16): 32-bit at a limit of 2**16, 64-bit at 2**16 - 1, the same bytes."""
    n = 8 << 16
    g = torch.randn(n, generator=torch.Generator().manual_seed(5))
    bits, scales = torch.ops.hgc_twin.onebit_encode(g, torch.zeros_like(g), 1)
    args = ([bits[None]], [scales[None]], [n], [1], [DTYPE_CODES[torch.float32]], 1.0, None)
    outs = {}
    for limit, expect in ((1 << 16, (1, 0)), ((1 << 16) - 1, (0, 1))):
        twin.set_index32_limit(limit)
        runs = _runs(twin, lambda: outs.update({limit: torch.ops.hgc_twin.onebit_decode_sum_many(*args)}))
        assert runs == expect, f"limit {limit}: (32-bit, 64-bit) stage runs {runs}, expected {expect}"
    _same(_tensors(outs[1 << 16]), _tensors(outs[(1 << 16) - 1]), "decode at both sides of the limit")
    ref = torch.ops.hgc_twin.onebit_decode_sum(bits[None], scales[None], n, 1, torch.float32, 1.0, False)
    _same(_tensors(outs[1 << 16]), [ref], "bucket decode vs the per-tensor decode")


def test_the_limit_is_checked(twin):
    assert twin.index32_limit() == 2**31 - 1
    for bad in (-1, 2**31):
        with pytest.raises(ValueError, match="32-bit index limit"):
            twin.set_index32_limit(bad)
    assert twin.index32_limit() == 2**31 - 1
    assert twin.set_index32_limit(0) == 2**31 - 1 and twin.index32_limit() == 0
