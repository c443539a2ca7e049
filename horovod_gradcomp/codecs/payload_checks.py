"""Checks a decoder runs on a received payload before it reads it.

Payloads come from other ranks: their buffers' names, dtypes, dims and lengths are data.
Every codec's decode paths (native and reference alike) call these O(1) checks first, so a
malformed payload raises :class:`MalformedPayloadError` naming the codec, the buffer and
what is wrong, instead of an IndexError deep inside torch, a crash, or a silently wrong
result. What the checks cannot see in O(1) (Elias codes, DGC indices) the decoders
validate themselves while they read.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

from .payload import BufferSpec, Payload


class MalformedPayloadError(ValueError, RuntimeError):
    """A payload does not have the layout its codec, shape and dtype call for.

    Both a ValueError and a RuntimeError, so that callers catching either (the native
    kernels raise RuntimeError) see it."""


def _fail(codec: str, msg: str) -> None:
    raise MalformedPayloadError(f"{codec}: malformed payload: {msg}")


def check_buffers(codec: str, payload: Payload, specs: Sequence[BufferSpec], stacked: bool = False) -> int:
    """Check ``payload.buffers`` against ``specs`` ((name, dtype, length) in wire order):
    the same names (in any order: a fused layout cuts them by element size), each buffer a tensor of its dtype on the payload's device,
    1-D (``stacked=False``) or 2-D ``[K, length]`` with one K >= 1 for all (``stacked=True``),
    of exactly its length (any length where it is None: the variable-size parts of a format,
    whose decoders check them). Returns K (1 when not stacked)."""
    bufs = payload.buffers
    names = tuple(name for name, _, _ in specs)
    if not isinstance(bufs, dict) or len(bufs) != len(names) or set(bufs) != set(names):
        got = tuple(bufs) if isinstance(bufs, dict) else type(bufs).__name__
        _fail(codec, f"expected buffers {names}, got {got}")
    k = None
    dims = 2 if stacked else 1
    for name, dtype, length in specs:
        b = bufs[name]
        if not isinstance(b, torch.Tensor):
            _fail(codec, f"buffer {name!r} is a {type(b).__name__}, not a tensor")
        if b.dtype != dtype:
            _fail(codec, f"buffer {name!r} must be {dtype}, got {b.dtype}")
        if b.device != payload.device:
            _fail(codec, f"buffer {name!r} is on {b.device}, the payload on {payload.device}")
        if b.dim() != dims:
            want = f"stacked as [K, {length}]" if stacked else f"flat [{length}]"
            _fail(codec, f"buffer {name!r} must be {want}, got shape {tuple(b.shape)}")
        if stacked:
            if k is None:
                k = b.shape[0]
            elif b.shape[0] != k:
                _fail(codec, f"buffer {name!r} stacks {b.shape[0]} payloads, {specs[0][0]!r} {k}")
        if length is not None and b.shape[-1] != length:
            _fail(codec, f"buffer {name!r} holds {b.shape[-1]} values, a {tuple(payload.shape)} {payload.dtype} "
                         f"tensor needs {length}")
    if stacked and not k:
        _fail(codec, "a stacked payload needs at least one payload (K >= 1)")
    return k if stacked else 1


def check_fixed(codec, payload: Payload, stacked: bool = False) -> int:
    """:func:`check_buffers` against ``codec.layout(payload.shape, payload.dtype)``
    (fixed-size codecs); returns K."""
    return check_buffers(codec.name, payload, codec.layout(payload.shape, payload.dtype), stacked)


def check_payload_list(codec: str, payloads: Sequence[Payload]) -> Tuple[Payload, int]:
    """``payloads`` is a non-empty list of payloads of one shape, dtype and device;
    returns (the first, K)."""
    if not payloads:
        raise MalformedPayloadError(f"{codec}: needs at least one payload")
    first = payloads[0]
    for p in payloads:
        if not isinstance(p, Payload):
            raise MalformedPayloadError(f"{codec}: expected Payload objects, got {type(p).__name__}")
        if p.shape != first.shape or p.dtype != first.dtype or p.device != first.device:
            raise MalformedPayloadError(f"{codec}: payloads of one shape, dtype and device expected, got "
                                        f"{tuple(first.shape)}/{first.dtype}/{first.device} and "
                                        f"{tuple(p.shape)}/{p.dtype}/{p.device}")
    return first, len(payloads)
