"""Counter-based random streams shared by the stochastic codecs (TernGrad, QSGD, DGC's sampling).

A codec's stream is identified by ``(seed, rank_stream)``; every encode draws from the key of
one *position* of that stream, and element i of a tensor gets a random number that depends on
(key, i) alone. Native kernels and the pure-torch references compute the same numbers, so a
reference replays a native encode bit for bit. The exchange sets the position before every
encode (``CounterStream.reset_stream``, rule in :mod:`horovod_gradcomp.exchange.stream_positions`),
so the numbers never depend on the order in which gradient hooks fire.

Two generators, both fixed by the native kernels' wire format:

* 64-bit (QSGD, DGC): key = SplitMix64 finalizer chain over (seed, rank_stream, position);
  element pair j draws ``mix64(key + (j + 1) * golden)`` and splits it into two 24-bit uniforms.
* 32-bit (TernGrad): two 32-bit keys from a SplitMix64 chain; element i draws
  lowbias32(lowbias32(key0 + i) ^ key1) >> 8.
"""
from __future__ import annotations

from typing import Tuple

import torch

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1, _MUL2 = 0x21F0AAAD, 0x735A2D97   # both < 2^31: int64 products of 32-bit values do not overflow


class CounterStream:
    """Mixin of the stochastic codecs: the position in a counter-based random stream.

    Each encode draws its random numbers from a key derived from (seed, rank_stream,
    ``counter``) and then advances ``counter`` by one; :meth:`reset_stream` moves it, so a
    codec (native or reference) replays the same numbers from the same position."""

    counter: int = 0

    def reset_stream(self, position: int = 0) -> None:
        """Move the stream to ``position``."""
        self.counter = int(position)

    def next_position(self) -> int:
        """The current position; advances the stream by one."""
        position = self.counter
        self.counter += 1
        return position


# -- integer mixing (Python ints, used for keys) ----------------------------------------------

def mix64(z: int) -> int:
    """The SplitMix64 output finalizer of a 64-bit value."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _signed64(z: int) -> int:
    z &= _M64
    return z - (1 << 64) if z >> 63 else z


# -- the 64-bit generator (QSGD, DGC) ------------------------------------------------------

def stream_key(seed: int, rank_stream: int, counter: int) -> int:
    """The 64-bit key of position ``counter`` of stream (seed, rank_stream), as a signed int64."""
    k = mix64(seed + _GOLDEN)
    k = mix64(k ^ (rank_stream & _M64))
    k = mix64(k + counter + _GOLDEN)
    return _signed64(k)


def _srl(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 values seen as uint64."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix64_t(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _srl(z, 30)) * _signed64(0xBF58476D1CE4E5B9)
    z = (z ^ _srl(z, 27)) * _signed64(0x94D049BB133111EB)
    return z ^ _srl(z, 31)


def uniforms(key: int, n: int, device=None) -> torch.Tensor:
    """float32[n] uniforms in [0, 1) of the stream with this key (the native kernels draw the same)."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    h = _mix64_t(key + ((i >> 1) + 1) * _signed64(_GOLDEN))
    bits = torch.where((i & 1) == 0, (h >> 8) & 0xFFFFFF, _srl(h, 40))
    return bits.to(torch.float32) * (2.0 ** -24)


# -- the 32-bit generator (TernGrad) -------------------------------------------------------

def splitmix64(x: int) -> int:
    """One SplitMix64 step: the finalizer of ``x + golden``."""
    return mix64((x & _M64) + _GOLDEN)


def stream_keys32(seed: int, rank_stream: int, call: int) -> Tuple[int, int]:
    """(key0, key1): the two 32-bit keys of position ``call`` of stream (seed, rank_stream)."""
    k = splitmix64(splitmix64(splitmix64(seed) ^ (rank_stream & _M64)) ^ (call & _M64))
    return k & _M32, k >> 32


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding 32-bit values, in place."""
    x.bitwise_xor_(x >> 16)
    x.mul_(_MUL1).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(_MUL2).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    return x


def uniform_bits(n: int, key0: int, key1: int, device=None) -> torch.Tensor:
    """The 24-bit integers ``h >> 8`` of elements 0..n-1 (int64), pure torch."""
    x = torch.arange(n, dtype=torch.int64, device=device).add_(key0).bitwise_and_(_M32)
    _mix32_(x).bitwise_xor_(key1)
    return _mix32_(x) >> 8
