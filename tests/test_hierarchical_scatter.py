"""The hierarchical pattern's node-scatter buffer, in one process: segment j holds stripe j of
every gradient of the bucket in the wire dtype, back to back, whatever the gradients' dtypes
(float64 next to float32 puts values at offsets not aligned for them), strides (column stripes)
or sizes (empty stripes). Checked against the stripes taken one by one and concatenated; with
one rank per node nothing is copied and the node's mean is the gradient itself."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.bucket import Bucket
from horovod_gradcomp.exchange.hierarchical import HierarchicalPattern, shard_key, wire_dtype
from horovod_gradcomp.exchange.stats import ExchangeStats


def _expected(pattern, names, grads):
    """Each segment built the plain way: stripe j of each gradient, converted, as bytes."""
    segments = []
    for j in range(pattern.ranks_per_node):
        parts = [pattern.shards(tuple(grads[n].shape), grads[n].dtype)[j].take(grads[n])
                 .reshape(-1).to(wire_dtype(grads[n].dtype)).view(torch.uint8) for n in names]
        segments.append(torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8))
    return segments


@pytest.mark.parametrize("codec_name", ["onebit", "qsgd"])  # fixed-size (column stripes possible) and variable
@pytest.mark.parametrize("ranks_per_node", [1, 2, 3])
def test_scatter_buffer_is_the_stripes_back_to_back(codec_name, ranks_per_node):
    gen = torch.Generator().manual_seed(7)
    specs = {"a": ((3,), torch.float32), "b": ((5, 7), torch.float64), "c": ((4, 9), torch.bfloat16),
             "d": ((0,), torch.float32), "e": ((2, 3, 3), torch.float16), "f": ((), torch.float64),
             "g": ((1, 13), torch.float32)}
    grads = {n: torch.randn(shape, generator=gen, dtype=torch.float64).to(dt) for n, (shape, dt) in specs.items()}
    grads["b"] = grads["b"].t().contiguous().t()  # a non-contiguous gradient
    names = sorted(grads)
    pattern = HierarchicalPattern(hgc.get_codec(codec_name), {}, lambda g, k: "allgather")
    pattern.connect(None, SimpleNamespace(rank=0, size=ranks_per_node), SimpleNamespace(rank=0, size=1))
    work = pattern.scatter(Bucket(names, grads, None, {n: i for i, n in enumerate(names)}, {}, None), ExchangeStats())
    want = _expected(pattern, names, grads)
    assert work.send_counts == [len(s) for s in want]
    if ranks_per_node == 1:   # nothing is sent: node_means takes the gradients themselves
        assert work.send.numel() == 0
        inner = pattern.node_means(work, work.send, Bucket(names, grads, None, {}, {}, None), ExchangeStats())
        assert sorted(inner.grads) == sorted(shard_key(n, 0) for n, _ in work.mine)
        for n, _ in work.mine:
            mean = inner.grads[shard_key(n, 0)]
            assert mean.dtype == grads[n].dtype and torch.equal(mean.reshape(-1), grads[n].reshape(-1))
        return
    assert torch.equal(work.send, torch.cat(want))
