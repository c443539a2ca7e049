"""The node layout of the hierarchical exchange, without MPI: explicit blocks, layouts from every
rank's (node, local rank), the environment variable, the launcher hint and the errors."""
from __future__ import annotations

import pytest

from horovod_gradcomp.exchange.topology import (block_layout, launcher_hint, layout_from_identities,
                                                 ranks_per_node_setting, require_equal)


def test_blocks_of_ranks_per_node():
    layout = block_layout(4, 2, rank=3)
    assert layout.nodes == ((0, 1), (2, 3)) and layout.equal and layout.multi_level
    assert (layout.node, layout.local_rank, layout.num_nodes, layout.ranks_per_node) == (1, 1, 2, 2)
    assert layout.describe() == "2 nodes x 2 ranks" and layout.key() == [[0, 1], [2, 3]]
    assert not block_layout(4, 1, 0).multi_level and not block_layout(4, 4, 0).multi_level


def test_unequal_blocks_are_named_in_the_error():
    layout = block_layout(3, 2, rank=2)
    assert layout.node_sizes == [2, 1] and not layout.equal and not layout.multi_level
    with pytest.raises(ValueError, match=r"3 ranks form 2 nodes of \[2, 1\] ranks"):
        require_equal(layout, "test")


def test_layout_from_identities_groups_by_node_and_orders_by_local_rank():
    # ranks 0 and 2 on one host, 1 and 3 on another (mpirun --map-by node); local ranks as MPI gives them
    layout = layout_from_identities([(0, 0), (1, 0), (0, 1), (1, 1)], rank=2, source="mpi")
    assert layout.nodes == ((0, 2), (1, 3)) and layout.node == 0 and layout.local_rank == 1


def test_explicit_setting_and_environment(monkeypatch):
    monkeypatch.delenv("HOROVOD_GRADCOMP_RANKS_PER_NODE", raising=False)
    assert ranks_per_node_setting(None) is None
    monkeypatch.setenv("HOROVOD_GRADCOMP_RANKS_PER_NODE", "4")
    assert ranks_per_node_setting(None) == 4 and ranks_per_node_setting(2) == 2   # the option wins
    monkeypatch.setenv("HOROVOD_GRADCOMP_RANKS_PER_NODE", "two")
    with pytest.raises(ValueError, match="HOROVOD_GRADCOMP_RANKS_PER_NODE must be a positive integer"):
        ranks_per_node_setting(None)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="ranks_per_node must be a positive int"):
            ranks_per_node_setting(bad)


def test_launcher_hint(monkeypatch):
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    assert not launcher_hint(8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert not launcher_hint(8)          # one node holds all K ranks
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert launcher_hint(8)
