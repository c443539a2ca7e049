"""Independent oracles of pieces the CPU kernels and the device sources share (issue 32 item 4):
a bug in a shared header is the same on both sides, so the bitwise twin test cannot see it.
Each model here is plain numpy, written from the spec (docs, ALGORITHMS.md), not from the
headers, and checked against the CPU kernels (torch.ops.hgc) and the twin (torch.ops.hgc_twin).

- csrc/dgc_accumulate_step.h (DGC's momentum correction of one value): every product and sum
  rounded on its own in the tensor's dtype.
- csrc/splitmix64.h and the counter-based stream of QSGD's stochastic rounding: value i of a
  tensor draws the low (i even) or high (i odd) 32 bits of mix64(key + (i // 2 + 1) * golden),
  and rounds its level up when (word >> 8) < frac * 2^24 (QSGD's levels, recovered from the
  decoded values of inputs whose levels are exact in float).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from horovod_gradcomp.native import require_native, require_twin


def accumulate_model(u, v, g, m, c, nesterov):
    """DGC momentum correction, one rounding per operation in the arrays' dtype:
    h = g * c (when c != 1); u' = u * m + h; v' = v + u' (nesterov: v' = (v + h) + u' * m)."""
    t = u.dtype.type
    m, c = t(m), t(c)
    h = g * c if c != t(1) else g.copy()
    un = (u * m) + h
    vn = (v + h) + (un * m) if nesterov else v + un
    return un, vn


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("coef", [1.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_dgc_accumulate_step_against_model(kernels, nesterov, coef, dtype):
    mod = require_native() if kernels == "native" else require_twin()
    gen = torch.Generator().manual_seed(7)
    # edge values: zeros, signed zero, tiny (subnormal products), huge, and ordinary values
    base = torch.randn(1000, generator=gen, dtype=torch.float64) * 10
    special = torch.tensor([0.0, -0.0, 1e-38, -1e-38, 3e38, -3e38, 1e-310, 1.0, -1.0, 0.1], dtype=torch.float64)
    g = torch.cat([special, base]).to(dtype)
    u = torch.cat([special.flip(0), base.roll(3)]).to(dtype)
    v = torch.cat([special, base.roll(5)]).to(dtype)
    m = 0.9
    eu, ev = accumulate_model(u.numpy().copy(), v.numpy().copy(), g.numpy(), m, coef, nesterov)
    uu, vv = u.clone(), v.clone()
    mod.dgc_accumulate_(uu, vv, g, m, nesterov, coef)
    np.testing.assert_array_equal(uu.numpy().view(np.uint8), eu.view(np.uint8))
    np.testing.assert_array_equal(vv.numpy().view(np.uint8), ev.view(np.uint8))
    uu, vv = u.clone(), v.clone()
    mod.dgc_accumulate_many_([uu], [vv], [g], m, nesterov, coef)
    np.testing.assert_array_equal(uu.numpy().view(np.uint8), eu.view(np.uint8))
    np.testing.assert_array_equal(vv.numpy().view(np.uint8), ev.view(np.uint8))


GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def mix64(z: int) -> int:
    """splitmix64's finalizer (Steele, Lea and Flood 2014; Vigna's constants)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def qsgd_levels_model(x, s, key):
    """QSGD's level of each value of x (a bucket whose max |x| is 1, max_norm): r = |x| * s,
    floor capped at s - 1, plus one when the value's random word says so."""
    levels = []
    for i, xi in enumerate(x):
        r = min(abs(xi) * s, s)
        fl = min(int(r), s - 1)
        h = mix64((key + (i // 2 + 1) * GOLDEN) & MASK)
        word = (h >> 32) if i % 2 else (h & 0xFFFFFFFF)
        levels.append(fl + (1 if (word >> 8) < (r - fl) * 2 ** 24 else 0))
    return levels


@pytest.mark.parametrize("kernels", ["native", "twin"])
@pytest.mark.parametrize("key", [0, 12345, -5, (1 << 62) + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_qsgd_random_stream_against_model(kernels, key, dtype):
    mod = require_native() if kernels == "native" else require_twin()
    s = 7
    # fractions k/64 (exact levels r = 7k/64 in float); 1.0 first makes the max norm 1
    x = [1.0] + [((-1) ** k) * (k % 64) / 64 for k in range(1, 203)]
    t = torch.tensor(x, dtype=dtype)
    norms, packed = mod.qsgd_encode_fixed(t, s, len(x), True, key)
    assert norms.tolist() == [1.0]
    dec = mod.qsgd_decode_fixed(norms[None], packed[None], len(x), s, len(x), dtype, 1.0)
    got = [round(abs(v) * s) for v in dec.double().tolist()]
    assert got == qsgd_levels_model(x, s, key & MASK)
