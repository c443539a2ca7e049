"""A pure-Python model of QSGD's Elias-coded payloads (issue 32 item 4): the bit reader and the
decode of qsgd_decode_elias, written from the wire format documented in
horovod_gradcomp/codecs/qsgd.py (module doc) and the errors the decoder defines
(csrc/payload_checks.h's messages), not from csrc/elias_bit_reader.h's code.

Format: buckets of d values; a group is ``group_buckets`` consecutive buckets whose code is
nbits[g] bits starting on a byte boundary (group g's bytes follow group g-1's ceil(nbits/8)).
Bits are read LSB-first (bit k of a group = bit k % 8 of its byte k // 8; zero past its bytes).
A bucket: gamma(nnz + 1), then per nonzero level in order gamma(gap + 1), a sign bit (1 =
negative), gamma(|level|). gamma(x): N zero bits, a one, the N low bits of x LSB-first.

Malformed (the decoder's one error for a group's code): a gamma with more than 31 zeros before its
one (or none at all), nnz + 1 - 1 above the bucket's length, a code read past nbits[g], a
position past the bucket, a level 0 or above s, or a group whose codes end before nbits[g].
Precisely (the order of the checks decides what "past" means): after the header, pos > nbits is
malformed; after a gap's gamma, pos >= nbits (no room for the sign); after a level's gamma,
pos > nbits; at the group's end pos must equal nbits.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

MALFORMED = "malformed Elias stream"


class EliasError(ValueError):
    """What the decoder raises; the message holds the substring the kernels' error holds."""


class Bits:
    """An LSB-first bit string over a group's bytes, zero past them."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def bit(self) -> int:
        k = self.pos
        self.pos += 1
        byte = k >> 3
        return (self.data[byte] >> (k & 7)) & 1 if byte < len(self.data) else 0

    def gamma(self) -> Optional[int]:
        """The next gamma code's value; None (malformed) when over 31 zeros lead it."""
        zeros = 0
        while True:
            if zeros > 31:
                return None
            if self.bit():
                break
            zeros += 1
        low = 0
        for k in range(zeros):
            low |= self.bit() << k
        return (1 << zeros) | low


def decode_group(data: bytes, nbits: int, lens: Sequence[int], s: int) -> List[List[Tuple[int, int]]]:
    """[(position, signed level) per nonzero] of each bucket of lengths ``lens`` of one group's code;
    raises EliasError(MALFORMED)."""
    br = Bits(data)
    out = []
    for length in lens:
        h = br.gamma()
        if h is None or h - 1 > length or br.pos > nbits:
            raise EliasError(MALFORMED)
        nz, pos = [], -1
        for _ in range(h - 1):
            gap = br.gamma()
            if gap is None or br.pos >= nbits:
                raise EliasError(MALFORMED)
            pos += gap
            neg = br.bit()
            lvl = br.gamma()
            if pos >= length or lvl is None or lvl > s or br.pos > nbits:
                raise EliasError(MALFORMED)
            nz.append((pos, -lvl if neg else lvl))
        out.append(nz)
    if br.pos != nbits:
        raise EliasError(MALFORMED)
    return out


def group_starts(nbits: Sequence[int], stream_bytes: int) -> List[int]:
    """The groups' byte offsets; raises EliasError naming a header that does not fit the stream."""
    starts = [0]
    for g, nb in enumerate(nbits):
        if nb < 0 or nb > 8 * stream_bytes:
            raise EliasError(f"group {g} claims {nb} bits")
        starts.append(starts[-1] + (nb + 7) // 8)
        if starts[-1] > stream_bytes:
            raise EliasError("bit counts run past the stream")
    if starts[-1] != stream_bytes:
        raise EliasError(f"the stream holds {stream_bytes} bytes, the header says {starts[-1]}")
    return starts


def levels(nbits: Sequence[int], stream: bytes, n: int, s: int, d: int, gb: int) -> np.ndarray:
    """int64[n] signed levels of an Elias payload; raises EliasError."""
    B = -(-n // d)
    starts = group_starts(nbits, len(stream))
    q = np.zeros(n, np.int64)
    for g in range(len(nbits)):
        buckets = range(g * gb, min(B, (g + 1) * gb))
        lens = [min(d, n - b * d) for b in buckets]
        dec = decode_group(stream[starts[g]:starts[g + 1]], nbits[g], lens, s)
        for b, nz in zip(buckets, dec):
            for pos, lvl in nz:
                q[b * d + pos] = lvl
    return q


def values(q: np.ndarray, norms: np.ndarray, s: int, d: int, acc) -> np.ndarray:
    """Decoded values in the arithmetic type: level * (norm / s) (bucket scale rounded once in acc),
    a negative level as -(|level| * scale), a zero level as 0 * scale."""
    n = q.shape[0]
    scale = np.repeat(norms.astype(acc) / acc(s), d)[:n]
    with np.errstate(invalid="ignore", over="ignore"):
        mag = np.abs(q).astype(acc) * scale
        return np.where(q < 0, -mag, mag).astype(acc)


# ---- a writer, for hand-built streams -----------------------------------------------------------


def gamma_bits(x: int) -> List[int]:
    """gamma(x), x >= 1, as bits in stream order."""
    N = x.bit_length() - 1
    return [0] * N + [1] + [(x >> k) & 1 for k in range(N)]


def bucket_bits(q: Sequence[int]) -> List[int]:
    """One bucket's code of its signed levels."""
    nz = [(i, v) for i, v in enumerate(q) if v != 0]
    bits = gamma_bits(len(nz) + 1)
    prev = -1
    for i, v in nz:
        bits += gamma_bits(i - prev) + [1 if v < 0 else 0] + gamma_bits(abs(v))
        prev = i
    return bits


def pack(bits: Sequence[int]) -> bytes:
    """LSB-first bytes of a bit list (pad bits 0)."""
    out = bytearray((len(bits) + 7) // 8)
    for k, b in enumerate(bits):
        out[k >> 3] |= (b & 1) << (k & 7)
    return bytes(out)


def encode(q: Sequence[int], d: int, gb: int) -> Tuple[List[int], List[List[int]]]:
    """(nbits per group, bit lists per group) of the signed levels q."""
    n = len(q)
    B = -(-n // d)
    G = max(1, -(-B // gb))
    groups = []
    for g in range(G):
        bits: List[int] = []
        for b in range(g * gb, min(B, (g + 1) * gb)):
            bits += bucket_bits(q[b * d:(b + 1) * d])
        groups.append(bits)
    return [len(b) for b in groups], groups
