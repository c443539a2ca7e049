"""HSDP mode's compression state (issue 40): what ``stats()["memory_bytes"]`` counts, and
checkpoints loaded at another split into nodes. On CPU with gloo under torchrun
(tests/fsdp_worker.py; its Net: ``inp`` a Linear(width, 9) with a frozen bias, ``mid`` a
Linear(9, 7), ``out`` a Linear(7, 5)).

The expected byte counts are computed here from the parameters' shapes, not by the package's code:
FSDP2 pads dim 0 of every parameter to a multiple of the L ranks of a node, so a rank's shard of a
``[d0, ...]`` parameter holds ``ceil(d0 / L) * prod(rest)`` values; every replica exchange keeps one
fp32 residual per trainable parameter of that size (onebit), or a velocity and an accumulation
(DGC with momentum). From three nodes on, a module whose payloads exceed the engine's 64 KiB
threshold takes the two-phase pattern: ``inp`` with 32768 or 65536 inputs does, the two small
modules do not. Its owner residuals are then onebit's row stripes of the rank's ``inp.weight``
shard: the rank on node n owns stripe n of R, ``rows // R + (n < rows % R)`` rows of ``width``
values.

Checkpoints: a job loading a compression state saved with another split into nodes at the same
world size (or saved in sharded mode: one "node" of all ranks) is refused on every rank, naming
both layouts.
"""
from __future__ import annotations

import math

import pytest

from launchers import last_json, run, torchrun

pytest.importorskip("torch.distributed.fsdp")

WORKER = "tests/fsdp_worker.py"
TIMEOUT = 300


def launch(k: int, *args: str) -> dict:
    result = last_json(run(torchrun(k, WORKER, *args), timeout=TIMEOUT))
    assert result["ok"], result
    return result


def trainable_shapes(width: int):
    """The trainable parameters of tests/fsdp_worker.py's Net (inp.bias is frozen)."""
    return [(9, width), (7, 9), (7,), (5, 7), (5,)]


def shard_values(shape, ranks_per_node: int) -> int:
    """Values of one rank's dim-0-padded shard of a parameter of ``shape``."""
    return math.ceil(shape[0] / ranks_per_node) * math.prod(shape[1:])


@pytest.mark.parametrize("nodes,ranks_per_node,width", [(3, 1, 32768), (3, 2, 65536)])
def test_memory_bytes_counts_the_two_phase_owner_residuals(nodes, ranks_per_node, width):
    """onebit between 3 nodes: each rank's memory_bytes is its residuals (4 bytes per value of its
    shard) plus its owner residuals (its row stripe of the inp.weight shard), the owner part
    reported alone as owner_memory_bytes; over the replicas the owner stripes add up to the shard."""
    k = nodes * ranks_per_node
    result = launch(k, "memory", "onebit", f"hsdp={nodes}", f"width={width}")
    assert result["finite"] and result["steps"] == 3, result
    residuals = 4 * sum(shard_values(s, ranks_per_node) for s in trainable_shapes(width))
    rows = math.ceil(9 / ranks_per_node)
    for rank in range(k):
        node = rank // ranks_per_node
        owned_rows = rows // nodes + (1 if node < rows % nodes else 0)
        owner = 4 * owned_rows * width
        assert result["owner_memory_bytes"][rank] == owner, (rank, result)
        assert result["memory_bytes"][rank] == residuals + owner, (rank, residuals, owner, result)
    for place in range(ranks_per_node):
        replicas = range(place, k, ranks_per_node)
        assert sum(result["owner_memory_bytes"][r] for r in replicas) == 4 * rows * width


@pytest.mark.parametrize("codec,width,per_value", [("onebit", 32768, 4), ("dgc", 16, 8)])
def test_memory_bytes_at_two_nodes_of_two(codec, width, per_value):
    """2 x 2: two replicas exchange by allgather (no owner residuals, even for a module as large as
    the 3-node test's); onebit keeps 4 bytes per value of the shard, DGC with momentum 8 (its
    velocity and its accumulation)."""
    result = launch(4, "memory", codec, "hsdp=2", f"width={width}")
    assert result["finite"] and result["steps"] == 3, result
    expected = per_value * sum(shard_values(s, 2) for s in trainable_shapes(width))
    assert result["memory_bytes"] == [expected] * 4, (expected, result)
    assert result["owner_memory_bytes"] == [0] * 4, result


LAYOUT_KEY = "compression.layout_nodes_x_ranks_per_node"


@pytest.mark.parametrize("saved,loaded,saved_shape,loaded_shape", [
    (("hsdp=2",), ("hsdp=4",), "[2, 2]", "[4, 1]"),   # 2 nodes x 2 ranks -> 4 nodes x 1 rank
    ((), ("hsdp=2",), "[1, 4]", "[2, 2]"),            # sharded over all 4 ranks -> HSDP 2 x 2
])
def test_dcp_load_at_another_split_into_nodes_is_refused_naming_both(saved, loaded, saved_shape, loaded_shape,
                                                                     tmp_path):
    """Same world size (4), another split into nodes: dcp.load raises on every rank (no hang), on the
    layout piece, whose saved and current shapes are the two layouts (nodes x ranks per node)."""
    where = str(tmp_path / "ckpt")
    launch(4, "checkpoint", "onebit", where, "save", *saved, "m=0")
    result = launch(4, "checkpoint", "onebit", where, "load", *loaded)
    assert result["raised_on"] == 4, result
    expected = f"saved torch.Size({saved_shape}) and current: torch.Size({loaded_shape}) for {LAYOUT_KEY}"
    assert expected in result["message"], result["message"]


def test_dcp_load_with_other_ranks_in_each_node_is_refused_naming_both(tmp_path):
    """2 x 2 saved with nodes [[0, 1], [2, 3]], loaded with nodes [[0, 2], [1, 3]]: the pieces have
    the same sizes, so dcp.load reads them, and every rank's load_state_dict refuses, naming both."""
    where = str(tmp_path / "ckpt")
    launch(4, "checkpoint", "onebit", where, "save", "hsdp=2", "m=0")
    result = launch(4, "checkpoint", "onebit", where, "load", "hsdp=2", "interleave=1")
    assert result["raised_on"] == 4, result
    assert ("written by a job of 2 nodes x 2 ranks (nodes [[0, 1], [2, 3]]); this job has 2 nodes x 2 ranks "
            "(nodes [[0, 2], [1, 3]])") in result["message"], result["message"]
