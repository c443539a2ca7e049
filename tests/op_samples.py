"""Sample arguments of every native op (tests/test_ops_registration.py, tests/test_device_host_syncs.py):
real payloads of a seeded gradient, in the schemas' forms (dtype lists as codes, per-tensor
payload lists flattened with their counts).
"""
from __future__ import annotations

import math

import torch

from horovod_gradcomp.codecs.ternary_sum import level_width
from horovod_gradcomp.ops import DTYPE_CODES

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def samples(namespace, dtype, n):
    """{op name: argument tuple} for every op, built from real payloads of a seeded gradient
    of n values (lists of dtypes as codes, payload lists flattened: the schemas' forms); a
    ``_into`` op writes into the new tensors it is given."""
    ops = getattr(torch.ops, namespace)
    gen = torch.Generator().manual_seed(1000 * n + DTYPES.index(dtype))
    g = torch.randn(n, generator=gen).to(dtype)
    code = DTYPE_CODES[dtype]
    s = {}
    # TernGrad
    scale = float(ops.terngrad_max_abs(g)) if n else 1.0
    codes, tsc = ops.terngrad_encode(g, scale, math.inf, 1, 2)
    width = level_width(1)
    s["terngrad_max_abs"] = (g,)
    s["terngrad_sigma"] = (g,)
    s["terngrad_encode"] = (g, scale, math.inf, 1, 2)
    s["terngrad_decode_sum"] = (codes[None], tsc[None], n, dtype, 0.5)
    s["terngrad_decode_sum_into"] = (codes[None], tsc[None], n, dtype, 0.5, torch.empty(n, dtype=dtype))
    levels = ops.terngrad_sum_levels(codes[None], n, width)
    s["terngrad_sum_levels"] = (codes[None], n, width)
    s["terngrad_sum_decode"] = (levels, n, 1, width, 0.5, dtype)
    s["terngrad_sum_decode_into"] = (levels, n, 1, width, 0.5, dtype, torch.empty(n, dtype=dtype))
    s["terngrad_scale_stats_many"] = ([g, g[: n // 2]], True)
    s["terngrad_encode_many"] = ([g], [scale], [math.inf], [1], [2])
    s["terngrad_decode_sum_many"] = ([codes[None]], [tsc[None]], [n], [code], 0.5)
    s["terngrad_decode_sum_many_into"] = ([codes[None]], [tsc[None]], [n], [code], 0.5, [torch.empty(n, dtype=dtype)])
    # onebit: one column (none for an empty gradient)
    cols = 1 if n else 0
    bits, osc = ops.onebit_encode(g, torch.zeros_like(g), cols)
    s["onebit_encode"] = (g, torch.zeros_like(g), cols, None, False)
    s["onebit_scales"] = (g, None, cols, False)
    s["onebit_scales_many"] = ([g], None, [cols], [True])
    s["onebit_decode"] = (bits, osc, n, cols, dtype, False)
    s["onebit_decode_into"] = (bits, osc, n, cols, dtype, torch.empty(n, dtype=dtype), False)
    s["onebit_decode_sum"] = (bits[None], osc[None], n, cols, dtype, 0.5, False)
    s["onebit_decode_sum_into"] = (bits[None], osc[None], n, cols, dtype, 0.5, torch.empty(n, dtype=dtype))
    # column windows: columns [1, 3) of a [n // 4, 4] matrix
    gc = g[: n // 4 * 4].clone()
    s["onebit_encode_columns"] = (gc, torch.zeros_like(gc), 4, 1, 3, None)
    cbits, csc = ops.onebit_encode_columns(gc, None, 4, 1, 3)
    s["onebit_decode_columns"] = (cbits, csc, torch.zeros_like(gc), 4, 1, 3)
    s["onebit_encode_many"] = ([g], [torch.zeros_like(g)], [cols], None, None)
    s["onebit_decode_sum_many"] = ([bits[None]], [osc[None]], [n], [cols], [code], 1.0, None)
    s["onebit_decode_sum_many_into"] = ([bits[None]], [osc[None]], [n], [cols], [code], 1.0,
                                        [torch.empty(n, dtype=dtype)], [False])
    s["onebit_encode_columns_many"] = ([gc], None, [4], [1], [3], None)
    s["onebit_decode_columns_many"] = ([cbits], [csc], [torch.zeros_like(gc)], [4], [1], [3])
    # QSGD: s = 7, buckets of 16, Elias groups of 2 buckets
    norms, packed = ops.qsgd_encode_fixed(g, 7, 16, False, 3)
    en, nb, st = ops.qsgd_encode_elias(g, 7, 16, False, 3, 2)
    s["qsgd_encode_fixed"] = (g, 7, 16, False, 3)
    s["qsgd_decode_fixed"] = (norms[None], packed[None], n, 7, 16, dtype, 1.0)
    s["qsgd_decode_fixed_into"] = (norms[None], packed[None], n, 7, 16, dtype, 1.0, torch.empty(n, dtype=dtype))
    s["qsgd_encode_elias"] = (g, 7, 16, False, 3, 2)
    s["qsgd_decode_elias"] = (en, nb, st, n, 7, 16, 2, dtype)
    s["qsgd_decode_elias_into"] = (en, nb, st, n, 7, 16, 2, dtype, torch.empty(n, dtype=dtype))
    s["qsgd_encode_fixed_many"] = ([g], 7, 16, True, [3])
    s["qsgd_decode_fixed_many"] = ([norms[None]], [packed[None]], [n], 7, 16, [code], 1.0)
    s["qsgd_decode_fixed_many_into"] = ([norms[None]], [packed[None]], [n], 7, 16, [code], 1.0,
                                        [torch.empty(n, dtype=dtype)])
    s["qsgd_encode_elias_many"] = ([g], 7, 16, False, [3], 2)
    s["qsgd_decode_elias_many"] = ([en], [1], [nb], [1], [st], [1], [n], 7, 16, 2, [code], 0.5)
    s["qsgd_decode_elias_many_into"] = ([en], [1], [nb], [1], [st], [1], [n], 7, 16, 2, [code], 0.5,
                                        [torch.empty(n, dtype=dtype)])
    # DGC: about a quarter of the values
    k = max(1, n // 4) if n else 0
    idx, vals, _, _ = ops.dgc_select(g, k, n, 5)
    icode = ops.dgc_index_encode(idx, n)
    s["dgc_select"] = (g, k, n, 5)
    s["dgc_scatter_sum"] = ([idx], [vals], n, dtype, 1.0)
    s["dgc_scatter_sum_into"] = ([idx], [vals], n, dtype, 1.0, torch.empty(n, dtype=dtype))
    s["dgc_index_encode"] = (idx, n)
    s["dgc_index_decode"] = (icode, idx.numel(), n)
    a = g if dtype in (torch.float32, torch.float64) else g.float()  # momentum in fp32/fp64 only
    s["dgc_accumulate"] = (torch.zeros_like(a), torch.zeros_like(a), a, 0.9, False, 1.0)
    s["dgc_scatter_sum_many"] = ([idx], [1], [vals], [1], [n], [code], 1.0)
    s["dgc_scatter_sum_many_into"] = ([idx], [1], [vals], [1], [n], [code], 1.0, [torch.empty(n, dtype=dtype)])
    s["dgc_decode_sum_many"] = ([icode], [1], [vals], [1], [n], [code], 1.0)
    s["dgc_decode_sum_many_into"] = ([icode], [1], [vals], [1], [n], [code], 1.0, [torch.empty(n, dtype=dtype)])
    s["dgc_accumulate_many"] = ([torch.zeros_like(a)], [torch.zeros_like(a)], [a], 0.9, True, 0.5)
    s["dgc_mask_many"] = ([idx], [g.clone()], [g.clone()])
    s["dgc_select_many"] = ([g], [k], [n], [5])
    s["dgc_index_encode_many"] = ([idx], [n])
    return s
