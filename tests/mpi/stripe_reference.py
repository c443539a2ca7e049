"""Pure-torch pieces of the reference models of the striped exchanges (two-phase, hierarchical):
balanced ranges, a stripe of a tensor and its write-back, and the reference codec's encode with
error feedback. Independent of the package's own stripes and memory (the oracle's side)."""
from __future__ import annotations

import horovod_gradcomp as hgc


def ranges(n, k):
    """k balanced contiguous ranges of n items, the first n % k one longer."""
    out, start = [], 0
    for s in range(k):
        stop = start + n // k + (s < n % k)
        out.append((start, stop))
        start = stop
    return out


def part_of(t, axis, a, b):
    """Stripe [a, b) along ``axis`` of the 2-D view [shape[0], -1] (1-D/0-d: one column), as the
    tensor it is encoded as: 2-D for >= 2-D tensors, flat otherwise."""
    m = t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(-1, 1)
    p = m[a:b] if axis == "rows" else m[:, a:b]
    return p.clone() if t.dim() >= 2 else p.reshape(-1).clone()


def put_part(t, axis, a, b, value):
    """Write ``value`` into stripe [a, b) of ``t`` (contiguous), in place."""
    m = t.view(t.shape[0], -1) if t.dim() >= 2 else t.view(-1, 1)
    p = m[a:b] if axis == "rows" else m[:, a:b]
    p.copy_(value.reshape(p.shape))


def ref_codec(name, options, rank):
    """The pure-torch codec of rank ``rank`` (its own stream where the codec has one)."""
    opts = dict(options)
    if name != "onebit":
        opts["rank_stream"] = rank
    return hgc.get_codec(name, impl="reference", **opts)


def ref_encode(codec, x, r, opts):
    """Encode x (+ residual r, updated in place) with the reference codec."""
    if r is None:
        return codec.encode(x, **opts)
    if codec.fuses_feedback:
        return codec.encode(x, residual=r, **opts)
    v = x + r
    payload = codec.encode(v, **opts)
    r.copy_(v - codec.decode(payload))
    return payload
