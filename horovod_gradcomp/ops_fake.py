"""Fake (meta) kernels of the native ops: the shapes, dtypes and devices of their outputs from
their arguments alone, so that ``torch.compile`` and ``torch.library.opcheck`` can run them on
fake tensors. Sizes that depend on the data (DGC's selection, an Elias stream, a DGC index
code) are new dynamic sizes. Scalar results (TernGrad's max |g| and sigma, DGC's threshold
and path) have no fake value: the fakes return 0, so code that branches on them is not
traceable (the codecs read them on the host anyway).
"""
from __future__ import annotations

import torch

from .dtype_codes import as_dtype

_U8, _F32, _F64 = torch.uint8, torch.float32, torch.float64


def _one_device(tensors, op, what):
    """The device of a bucket's tensors; the kernels' error when they are not on one device."""
    for i, t in enumerate(tensors):
        if t.device != tensors[0].device:
            raise RuntimeError(f"{op}: {what} {i} is on {t.device}, {what} 0 on {tensors[0].device} "
                               "(a bucket is on one device)")
    return tensors[0].device if tensors else torch.device("cpu")


def _empty(n, dtype, device):
    return torch.empty(int(n), dtype=dtype, device=device)


def _dynamic(device, dtype=_U8):
    return torch.empty(torch.library.get_ctx().new_dynamic_size(), dtype=dtype, device=device)


# -- TernGrad ------------------------------------------------------------------------------------

def terngrad_max_abs(grad):
    return 0.0


def terngrad_sigma(grad):
    return 0.0


def terngrad_encode(grad, scale, clip, key0, key1):
    return _empty((grad.numel() + 3) // 4, _U8, grad.device), _empty(1, _F32, grad.device)


def terngrad_decode_sum(codes, scales, n, dtype, scale):
    return _empty(n, dtype, codes.device)


def terngrad_sum_levels(codes, n, width):
    return _empty((n * width + 7) // 8, _U8, codes.device)


def terngrad_sum_decode(levels, n, k, width, mult, dtype):
    return _empty(n, dtype, levels.device)


def terngrad_scale_stats_many(grads, with_sigma):
    return torch.empty(2, len(grads), dtype=_F64, device=_one_device(grads, "terngrad_scale_stats_many", "gradient"))


def terngrad_encode_many(grads, scales, clips, key0s, key1s):
    _one_device(grads, "terngrad_encode_many", "gradient")
    pairs = [terngrad_encode(g, 0.0, 0.0, 0, 0) for g in grads]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def terngrad_decode_sum_many(codes, scales, n, dtypes, scale):
    device = _one_device(codes, "terngrad_decode_sum_many", "codes")
    return [_empty(m, as_dtype(d), device) for m, d in zip(n, dtypes)]


# -- onebit --------------------------------------------------------------------------------------

def onebit_encode(grad, residual, cols, scales=None, by_rows=False):
    return _empty((grad.numel() + 7) // 8, _U8, grad.device), _empty(2 * cols, _F32, grad.device)


def onebit_scales(grad, residual, cols, by_rows=False):
    return _empty(2 * cols, _F32, grad.device)


def onebit_scales_many(grads, residuals, cols, by_rows=None):
    device = _one_device(grads, "onebit_scales_many", "gradient")
    return [_empty(2 * c, _F32, device) for c in cols]


def onebit_decode(bits, scales, n, cols, dtype, by_rows=False):
    return _empty(n, dtype, bits.device)


def onebit_decode_sum(bits, scales, n, cols, dtype, scale, by_rows=False):
    return _empty(n, dtype, bits.device)


def onebit_encode_columns(full, residual, full_cols, col0, col1, scales=None):
    rows = full.numel() // full_cols if full_cols > 0 else 0
    return _empty((rows * (col1 - col0) + 7) // 8, _U8, full.device), _empty(2 * (col1 - col0), _F32, full.device)


def onebit_decode_columns(bits, scales, out, full_cols, col0, col1):
    return None


def onebit_encode_many(grads, residuals, cols, scales=None, by_rows=None):
    _one_device(grads, "onebit_encode_many", "gradient")
    pairs = [onebit_encode(g, None, c) for g, c in zip(grads, cols)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def onebit_decode_sum_many(bits, scales, n, cols, dtypes, scale, by_rows=None):
    device = _one_device(bits, "onebit_decode_sum_many", "bits")
    return [_empty(m, as_dtype(d), device) for m, d in zip(n, dtypes)]


def onebit_encode_columns_many(fulls, residuals, full_cols, col0, col1, scales=None):
    _one_device(fulls, "onebit_encode_columns_many", "tensor")
    pairs = [onebit_encode_columns(f, None, fc, a, b) for f, fc, a, b in zip(fulls, full_cols, col0, col1)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def onebit_decode_columns_many(bits, scales, outs, full_cols, col0, col1):
    _one_device(outs, "onebit_decode_columns_many", "out")
    return None


# -- QSGD ----------------------------------------------------------------------------------------

def _buckets(n, bucket):
    return (n + bucket - 1) // bucket if bucket > 0 else 0


def qsgd_encode_fixed(x, s, bucket, max_norm, key):
    n, width = x.numel(), 1 + int(s).bit_length()
    return _empty(_buckets(n, bucket), _F32, x.device), _empty((n * width + 7) // 8, _U8, x.device)


def qsgd_decode_fixed(norms, packed, n, s, bucket, dtype, scale=1.0):
    return _empty(n, dtype, norms.device)


def qsgd_encode_elias(x, s, bucket, max_norm, key, group_buckets):
    b = _buckets(x.numel(), bucket)
    groups = max(1, (b + group_buckets - 1) // group_buckets) if group_buckets > 0 else 1
    return _empty(b, _F32, x.device), _empty(groups, torch.int64, x.device), _dynamic(x.device)


def qsgd_decode_elias(norms, nbits, stream, n, s, bucket, group_buckets, dtype):
    return _empty(n, dtype, norms.device)


def qsgd_encode_fixed_many(xs, s, bucket, max_norm, keys):
    _one_device(xs, "qsgd_encode_fixed_many", "tensor")
    pairs = [qsgd_encode_fixed(x, s, bucket, max_norm, 0) for x in xs]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def qsgd_decode_fixed_many(norms, packed, n, s, bucket, dtypes, scale):
    device = _one_device(norms, "qsgd_decode_fixed_many", "norms")
    return [_empty(m, as_dtype(d), device) for m, d in zip(n, dtypes)]


def qsgd_encode_elias_many(xs, s, bucket, max_norm, keys, group_buckets):
    _one_device(xs, "qsgd_encode_elias_many", "tensor")
    triples = [qsgd_encode_elias(x, s, bucket, max_norm, 0, group_buckets) for x in xs]
    return [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples]


def qsgd_decode_elias_many(norms, norms_counts, nbits, nbits_counts, streams, streams_counts, n, s, bucket,
                           group_buckets, dtypes, scale):
    device = _one_device(norms, "qsgd_decode_elias_many", "norms")
    return [_empty(m, as_dtype(d), device) for m, d in zip(n, dtypes)]


# -- DGC -----------------------------------------------------------------------------------------

def _index_dtype(n):
    return torch.int64 if n >= 1 << 31 else torch.int32


def dgc_select(x, k, sample_count, key):
    size = torch.library.get_ctx().new_dynamic_size()
    return (torch.empty(size, dtype=_index_dtype(x.numel()), device=x.device),
            torch.empty(size, dtype=x.dtype, device=x.device), 0.0, 0)


def dgc_scatter_sum(indices, values, n, dtype, scale=1.0):
    return _empty(n, dtype, _one_device(list(indices) + list(values), "dgc_scatter_sum", "tensor"))


def dgc_index_encode(indices, n):
    return _dynamic(indices.device)


def dgc_index_decode(code, count, n):
    return torch.empty(count, dtype=_index_dtype(n), device=code.device)  # count may be a symbolic size


def dgc_accumulate(u, v, g, momentum, nesterov, coef=1.0):
    return None


def dgc_scatter_sum_many(indices, indices_counts, values, values_counts, n, dtypes, scale):
    device = _one_device(indices, "dgc_scatter_sum_many", "indices")
    return [_empty(m, as_dtype(d), device) for m, d in zip(n, dtypes)]


def dgc_decode_sum_many(codes, codes_counts, values, values_counts, n, dtypes, scale):
    device = _one_device(codes, "dgc_decode_sum_many", "codes")
    return [_empty(m, as_dtype(d), device) for m, d in zip(n, dtypes)]


def dgc_accumulate_many(u, v, g, momentum, nesterov, coef=1.0):
    _one_device(g, "dgc_accumulate_many", "gradient")
    return None


def dgc_mask_many(indices, v, u=None):
    _one_device(v, "dgc_mask_many", "accumulation")
    return None


def dgc_select_many(xs, k, sample_count, keys):
    _one_device(xs, "dgc_select_many", "x")
    picks = [dgc_select(x, 0, 0, 0) for x in xs]
    return [p[0] for p in picks], [p[1] for p in picks], [0.0] * len(xs), [0] * len(xs)


def dgc_index_encode_many(indices, n):
    device = _one_device(indices, "dgc_index_encode_many", "indices")
    return [_dynamic(device) for _ in indices]


def _writes_into(*args, **kwargs):
    """The fake of every ``<decode>_into`` op: it writes into the caller's out(s) and returns
    nothing (their shapes are checked by the real kernel)."""
    return None


_registered: set = set()


def register(namespace: str, names) -> None:
    """Register the fake kernel of each op ``namespace::name`` (once per process)."""
    for name in names:
        qualname = f"{namespace}::{name}"
        if qualname not in _registered:
            torch.library.register_fake(qualname, _writes_into if name.endswith("_into") else globals()[name])
            _registered.add(qualname)
