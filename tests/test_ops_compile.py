"""The native ops under ``torch.compile`` (issue 32 item 1), single process, CPU.

Every codec's encode and decode, called through ``_C`` as the codecs call them (a decode with
``out=None`` is the op ``name``, with an out the op ``name_into``: csrc/ops/schemas.h), traced
with ``fullgraph=True``: the results are bitwise the eager ones.

* ``aot_eager`` (AOT autograd and functionalization, no code generation): every codec, DGC's
  data-dependent sizes included (``capture_dynamic_output_shape_ops``).
* ``inductor`` (the default backend): onebit, TernGrad and QSGD (fixed and Elias). DGC's
  selection returns its threshold and path as Python scalars, which inductor cannot lower
  ("FallbackKernel output type <class 'float'> is not supported"): docs/guide/ddp.md.
"""
from __future__ import annotations

import pytest
import torch

from horovod_gradcomp.native import require_native

pytestmark = pytest.mark.timeout(600)
N = 1000


@pytest.fixture(autouse=True)
def _dynamo_config():
    config = torch._dynamo.config
    saved = (config.capture_dynamic_output_shape_ops, config.capture_scalar_outputs)
    config.capture_dynamic_output_shape_ops = config.capture_scalar_outputs = True
    torch._dynamo.reset()
    yield
    config.capture_dynamic_output_shape_ops, config.capture_scalar_outputs = saved
    torch._dynamo.reset()


def _quantized(x):
    """onebit, TernGrad and QSGD (fixed, Elias) encoded and decoded; one decode into an out."""
    C = require_native()
    n, results = x.numel(), []
    bits, scales = C.onebit_encode(x, torch.zeros_like(x), 4)
    results.append(C.onebit_decode(bits, scales, n, 4, x.dtype))
    into = torch.empty_like(x)
    C.onebit_decode_sum(bits[None], scales[None], n, 4, x.dtype, 0.5, into)
    results.append(into)
    codes, tscale = C.terngrad_encode(x, 4.5, float("inf"), 1, 2)  # the scale: above this x's max |value|
    results.append(C.terngrad_decode_sum(codes[None], tscale[None], n, x.dtype, 1.0))
    norms, packed = C.qsgd_encode_fixed(x, 15, 128, False, 5)
    results.append(C.qsgd_decode_fixed(norms[None], packed[None], n, 15, 128, x.dtype))
    enorms, nbits, stream = C.qsgd_encode_elias(x, 15, 128, False, 5, 2)
    results.append(C.qsgd_decode_elias(enorms, nbits, stream, n, 15, 128, 2, x.dtype))
    results.append(C.qsgd_decode_fixed_many([norms[None]], [packed[None]], [n], 15, 128, [x.dtype], 1.0,
                                            [torch.empty_like(x)])[0])
    return results


def _dgc(x):
    """DGC: selection, index code, decode and scatter-sum, and the bucket decode."""
    C = require_native()
    n = x.numel()
    idx, vals, _, _ = C.dgc_select(x, 50, n, 7)
    code = C.dgc_index_encode(idx, n)
    back = C.dgc_index_decode(code, idx.numel(), n)
    return [C.dgc_scatter_sum([back], [vals], n, x.dtype, 1.0),
            C.dgc_decode_sum_many([[code]], [[vals]], [n], [x.dtype], 0.5, [None])[0]]


@pytest.mark.parametrize("fn,backend", [(_quantized, "aot_eager"), (_dgc, "aot_eager"), (_quantized, "inductor")],
                         ids=["quantized-aot_eager", "dgc-aot_eager", "quantized-inductor"])
def test_compiled_encode_decode_is_bitwise_eager(fn, backend):
    x = torch.randn(N, generator=torch.Generator().manual_seed(3))
    assert float(x.abs().max()) < 4.5
    eager = fn(x)
    compiled = torch.compile(fn, fullgraph=True, backend=backend)(x)
    assert len(compiled) == len(eager)
    for i, (got, want) in enumerate(zip(compiled, eager)):
        assert torch.equal(got, want), f"result {i} differs under {backend}"


def test_decode_with_and_without_out_are_the_two_ops():
    C = require_native()
    x = torch.randn(N, generator=torch.Generator().manual_seed(4))
    norms, packed = C.qsgd_encode_fixed(x, 15, 128, False, 5)
    fresh = C.qsgd_decode_fixed(norms[None], packed[None], N, 15, 128, x.dtype)
    out = torch.full_like(x, float("nan"))
    assert C.qsgd_decode_fixed(norms[None], packed[None], N, 15, 128, x.dtype, 1.0, out) is out
    assert torch.equal(out, fresh)
    # a bucket's outs: the given ones are written and returned, None ones are new tensors
    given = torch.full_like(x, float("nan"))
    both = C.qsgd_decode_fixed_many([norms[None], norms[None]], [packed[None], packed[None]], [N, N], 15, 128,
                                    [x.dtype, x.dtype], 1.0, [given, None])
    assert both[0] is given and torch.equal(both[0], fresh) and torch.equal(both[1], fresh)
    with pytest.raises(TypeError, match="unexpected or repeated argument 'outt'"):
        C.qsgd_decode_fixed(norms[None], packed[None], N, 15, 128, x.dtype, outt=out)
    assert C.qsgd_decode_fixed.packet is torch.ops.hgc.qsgd_decode_fixed
