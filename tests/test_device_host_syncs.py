"""Host synchronizations of the device path's bucket ops (issue 32 item 2), counted on the twin
the way device algorithm calls are (``_C_twin.host_syncs()``: every read back from the device,
csrc/device/exec.cuh's ``to_host`` and ``policy_read``, ops_common.h's ``read_back``). Table
uploads do not wait (pinned staging memory released by a stream event on CUDA), so: none for
onebit, TernGrad and fixed-width QSGD; at most one per bucket op for the data-dependent sizes of
DGC (its selection's counts, its index codes' widths) and Elias-coded QSGD (the stream lengths
when encoding; when decoding, the flag that says whether a header or a code was refused: the
headers are checked and scanned on the device). The count must not grow with the bucket's tensor
count. DGC's refinement (a sampled estimate off by more than 2x, the exact fallback) is decided
and done on the device (a segmented radix select), so its selection reads back once on every path.
"""
from __future__ import annotations

import math

import pytest
import torch

from horovod_gradcomp.native import require_twin
from horovod_gradcomp.ops import DTYPE_CODES
from op_samples import DTYPES, samples

# The most host synchronizations a bucket op may make, whatever its tensor count.
MOST = {
    "terngrad_scale_stats_many": 0, "terngrad_encode_many": 0, "terngrad_decode_sum_many": 0,
    "onebit_scales_many": 0, "onebit_encode_many": 0, "onebit_decode_sum_many": 0,
    "onebit_encode_columns_many": 0, "onebit_decode_columns_many": 0,
    "qsgd_encode_fixed_many": 0, "qsgd_decode_fixed_many": 0,
    "qsgd_encode_elias_many": 1, "qsgd_decode_elias_many": 1,
    "dgc_accumulate_many": 0, "dgc_mask_many": 0,
    "dgc_select_many": 1, "dgc_index_encode_many": 1, "dgc_scatter_sum_many": 1, "dgc_decode_sum_many": 1,
}
# A bucket decode into the caller's outs runs the same kernel: the same bound.
MOST.update({name + "_into": MOST[name] for name in ("terngrad_decode_sum_many", "onebit_decode_sum_many",
                                                     "qsgd_decode_fixed_many", "qsgd_decode_elias_many",
                                                     "dgc_scatter_sum_many", "dgc_decode_sum_many")})


def _bucket(name, count, dtype):
    """Arguments of bucket op ``name`` over ``count`` tensors (sizes 7, 65, 1, 7, ...): each
    tensor's sample arguments (tests/op_samples.py) concatenated list by list."""
    per = [samples("hgc_twin", dtype, n)[name] for n in ([7, 65, 1] * count)[:count]]
    args = []
    for j, first in enumerate(per[0]):
        if isinstance(first, list):
            args.append([x for p in per for x in p[j]])
        else:
            args.append(first)  # one value for the bucket (s, bucket, scale, ...)
    return tuple(args)


def syncs(twin, fn):
    before = twin.host_syncs()
    fn()
    return twin.host_syncs() - before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", sorted(MOST))
def test_bucket_op_host_syncs(name, dtype):
    twin = require_twin()
    op = getattr(torch.ops.hgc_twin, name)
    counts = []
    for count in (1, 3, 6):
        args = _bucket(name, count, dtype)
        counts.append(syncs(twin, lambda: op(*args)))
    assert max(counts) <= MOST[name], f"{name}: {counts} host synchronizations for 1, 3 and 6 tensors"
    assert counts[0] == counts[1] == counts[2], f"{name}: {counts} grows with the tensor count"


def test_dgc_refinement_reads_back_once():
    """Half the values 2, half 1 (a sampled estimate counts far more than 2k: path 1, the
    refinement) and a few nonzeros among zeros (fewer than k/2: path 2) beside an ordinary tensor:
    one read back for the bucket, as on the sampled path; the index code of that selection one too."""
    twin = require_twin()
    n = 40_000
    ties = (1.0 + (torch.arange(n) % 2).double()).to(torch.float32)
    sparse = torch.zeros(n)
    sparse[::8000] = 1.5
    xs = [ties, torch.randn(n), ties.clone(), sparse]
    k, m = [n // 100] * 4, [n // 100] * 4
    out = []
    assert syncs(twin, lambda: out.append(torch.ops.hgc_twin.dgc_select_many(xs, k, m, [1, 2, 3, 4]))) == 1
    paths = list(out[0][3])
    assert paths[0] == paths[2] == 1 and paths[3] == 2, paths  # both refinement paths ran
    assert syncs(twin, lambda: torch.ops.hgc_twin.dgc_index_encode_many(out[0][0], [n] * 4)) == 1


def test_reads_back_are_counted():
    """The counter sees a read back: a per-tensor op that returns a host value reads once."""
    twin = require_twin()
    g = torch.randn(100)
    assert syncs(twin, lambda: twin.terngrad_max_abs(g)) == 1
    assert syncs(twin, lambda: twin.terngrad_encode(g, 3.0, math.inf, 1, 2)) == 0
