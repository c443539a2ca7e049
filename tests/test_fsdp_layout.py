"""Single-process parts of the FSDP2 path: the shard layout of a reduce-scatter input and the
owner's factor of FSDP2's reduce op (the collectives are in tests/test_fsdp.py, under torchrun)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torch.distributed.fsdp")

from horovod_gradcomp.exchange.reduce_scatter import ShardLayout, memory_keys  # noqa: E402
from horovod_gradcomp.fsdp.comm import owner_scale  # noqa: E402


def test_layout_cuts_every_chunk_into_the_padded_shards():
    lay = ShardLayout([("w", (3, 4)), ("b", (3,))], world_size=2)
    assert (lay.chunk_numel, lay.numel) == (15, 30)
    flat = torch.arange(30.0)
    w1, b1 = lay.views(flat, 1)
    assert w1.shape == (3, 4) and torch.equal(w1.reshape(-1), torch.arange(15.0, 27.0))
    assert torch.equal(b1, torch.arange(27.0, 30.0))
    own_w, own_b = lay.views(torch.arange(15.0), 1)      # a chunk-sized vector: the chunk index is ignored
    assert torch.equal(own_b, torch.arange(12.0, 15.0))
    w1.zero_()                                            # views, not copies
    assert flat[15:27].abs().sum() == 0
    assert lay.keys(1) == ["w[1]", "b[1]"]
    assert memory_keys(lay) == ["w[0]", "b[0]", "w[1]", "b[1]"]


def test_layout_refuses_inputs_of_another_size_and_repeated_names():
    lay = ShardLayout([("w", (2, 2))], world_size=2)
    with pytest.raises(ValueError, match="expected a flat contiguous input of 8 values"):
        lay.check(torch.zeros(9), torch.zeros(4), "owner")
    with pytest.raises(ValueError, match="repeat"):
        ShardLayout([("w", (2,)), ("w", (2,))], world_size=2)


def test_owner_scale_follows_fsdp2_ops():
    assert owner_scale(dist.ReduceOp.AVG, 4, "o") == 0.25
    assert owner_scale(dist.ReduceOp.SUM, 4, "o") == 1.0
    assert owner_scale(dist.ReduceOp.PREMUL_SUM(0.125), 4, "o") == 0.125
    with pytest.raises(ValueError, match="AVG, SUM or PREMUL_SUM"):
        owner_scale(dist.ReduceOp.MAX, 4, "o")
