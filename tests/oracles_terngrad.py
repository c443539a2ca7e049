"""numpy models of TernGrad's shared pieces (issue 32 item 4), written from the documented
definitions (horovod_gradcomp/codecs/terngrad.py's module doc, ALGORITHMS.md section 2 and the
order stated in csrc/device/terngrad_functors.h's comments), not from the kernels' code.

* The fixed-order sum (the clip's sigma): L = min(n, SUM_LANES) lanes, lane p = ((0.0 + v[p]) +
  v[p + L]) + ... in index order (float64); then the values in blocks of SUM_BLOCK (each block
  0.0 + its values in order), and the block sums again, until one value is left.
* sigma = sqrt(sum((v - mean)^2) / n), mean = sum(v) / n, both sums in the order above.
* max |g|: the largest |g| (0 for no values), NaN when any value is NaN.
* The random stream: element i draws h = mix32(mix32((i + key0) mod 2^32) ^ key1) (mix32: the
  "lowbias32" hash), u = float(h >> 8) * 2^-24 in the arithmetic type A (float32; float64 for
  fp64); its code is (u * s < min(|g|, clip)) ? (g < 0 ? 2 : 1) : 0, four 2-bit codes per byte
  (element 4b + t at bits 2t of byte b); all codes 0 when s == 0.
"""
from __future__ import annotations

import numpy as np

SUM_LANES = 65536
SUM_BLOCK = 256


def fixed_order_sum(x: np.ndarray, lanes: int = SUM_LANES, block: int = SUM_BLOCK) -> float:
    """The fixed-order float64 sum of x (1-D float64): lanes, then blocks of blocks."""
    n = x.shape[0]
    if n == 0:
        return 0.0
    L = min(n, lanes)
    acc = np.zeros(L, np.float64)
    for row in range(0, n, L):
        seg = x[row:row + L]
        acc[:seg.shape[0]] = acc[:seg.shape[0]] + seg
    while acc.shape[0] > 1:
        m = acc.shape[0]
        nb = -(-m // block)
        out = np.zeros(nb, np.float64)
        for j in range(block):  # value j of every block, blocks side by side
            idx = np.arange(nb) * block + j
            ok = idx < m
            out[ok] = out[ok] + acc[idx[ok]]
        acc = out
    return float(acc[0])


def sigma(x: np.ndarray, lanes: int = SUM_LANES, block: int = SUM_BLOCK) -> float:
    """terngrad_sigma of x (values exactly as float64): sqrt(fixed_sum((x - mean)^2) / n)."""
    n = x.shape[0]
    if n == 0:
        return 0.0
    mean = fixed_order_sum(x, lanes, block) / n
    with np.errstate(over="ignore", invalid="ignore"):
        d = x - mean
        sq = fixed_order_sum(d * d, lanes, block)
        return float(np.sqrt(np.float64(sq) / np.float64(n)))


def max_abs(x: np.ndarray) -> float:
    """terngrad_max_abs of x (float64): max |x|, 0.0 when empty, NaN when any value is NaN."""
    if x.shape[0] == 0:
        return 0.0
    if np.isnan(x).any():
        return float("nan")
    return float(np.abs(x).max())


def mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 on uint32 arrays (wrapping multiplications)."""
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x = x * np.uint32(0x21F0AAAD)
    x ^= x >> np.uint32(15)
    x = x * np.uint32(0x735A2D97)
    x ^= x >> np.uint32(15)
    return x


def uniforms(n: int, key0: int, key1: int, acc) -> np.ndarray:
    """u of elements 0..n-1 in the arithmetic type ``acc``."""
    i = (np.arange(n, dtype=np.uint64) + np.uint64(key0)) & np.uint64(0xFFFFFFFF)
    h = mix32(mix32(i.astype(np.uint32)) ^ np.uint32(key1))
    return (h >> np.uint32(8)).astype(np.int32).astype(acc) * acc(2.0 ** -24)


def encode_codes(g: np.ndarray, s: float, clip: float, key0: int, key1: int, acc) -> np.ndarray:
    """terngrad_encode's code bytes of g (values exact in ``acc``): uint8[ceil(n / 4)]."""
    n = g.shape[0]
    codes = np.zeros(n, np.uint8)
    if n and s != 0:
        v = g.astype(acc)
        with np.errstate(invalid="ignore", over="ignore"):
            a = np.abs(v)
            c = acc(clip)
            a = np.where(c < a, c, a)  # a NaN stays NaN (never selected)
            sel = uniforms(n, key0, key1, acc) * acc(s) < a
        codes = np.where(sel, np.where(v < 0, 2, 1), 0).astype(np.uint8)
    padded = np.zeros(-(-n // 4) * 4, np.uint8)
    padded[:n] = codes
    q = padded.reshape(-1, 4)
    return (q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)).astype(np.uint8)
