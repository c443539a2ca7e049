"""The DDP comm hook with ``pattern="hierarchical"`` under mpirun (-np 1, 2, 3, 4).

torch.distributed (gloo) on the mpirun ranks, nodes laid out by ``ranks_per_node`` (2 x 2 at
-np 4, one rank per node otherwise). A DDP model with ``hgc.ddp.register(..., pattern=
"hierarchical", ranks_per_node=L)`` trains a few steps; every step its averaged gradients must
be bitwise what the mpi4py path's engine makes of the same local gradients with the same bucket
partition (its node and peer communicators are torch.distributed groups here, MPI
communicators there), and the two states must be equal. Then: a non-finite gradient on one rank
and the unequal layout at -np 3.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mpi4py import MPI

import horovod_gradcomp as hgc

from .mpi_ddp import batch, model, setup_module, step_against_mpi_path  # noqa: F401 - setup_module: gloo on the mpirun ranks
from .mpi_transports import flat_state

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
L = 2 if SIZE == 4 else 1
STEPS = 3

CASES = {  # id: (codec, options)
    "onebit-allgather": ("onebit", {"lr_warmup_steps": 0, "inner_pattern": "allgather"}),
    "onebit-two_phase": ("onebit", {"lr_warmup_steps": 0, "inner_pattern": "two_phase"}),
    "terngrad-two_phase": ("terngrad", {"seed": 1, "inner_pattern": "two_phase"}),
    "qsgd-elias": ("qsgd", {"bits": 4, "coding": "elias", "seed": 3}),
    "dgc": ("dgc", {"density": 0.1, "seed": 4, "momentum": 0.9}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_hook_matches_mpi_path_bitwise(case):
    codec, options = CASES[case]
    options = dict(options, pattern="hierarchical", ranks_per_node=L)
    plain = model()
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=0.004)
    state = hgc.ddp.register(ddp, codec, **options)
    assert state.compression.engine.layout.describe() == f"{SIZE // L} nodes x {L} ranks"
    factory = getattr(hgc.Compression, codec)
    extra = {"check_optimizer": False} if codec == "dgc" else {}
    by_mpi = factory(list(plain.named_parameters()), transport="mpi", **options, **extra)
    for step in range(STEPS):
        partition, _ = step_against_mpi_path(ddp, plain, state, by_mpi, step, case)
        assert len(partition) > 1 or step == 0, f"{case}: the model should span several buckets"
        every = MPI.COMM_WORLD.allgather(torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()]))
        assert all(torch.equal(e, every[0]) for e in every), "ranks differ"
    a, b = flat_state(state.state_dict()), flat_state(by_mpi.state_dict())
    assert [k for k, _ in a] == [k for k, _ in b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))
    assert state.state_dict()["layout"] == by_mpi.state_dict()["layout"]
    stats, want_stats = state.stats(), by_mpi.stats()
    for key in ("bytes_payload", "bytes_sent", "bytes_sent_intra_node", "bytes_sent_inter_node", "tensors"):
        assert stats[key] == want_stats[key], key


def test_nonfinite_gradient_on_one_rank_skips_the_step_everywhere():
    ddp = nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.004)
    state = hgc.ddp.register(ddp, "onebit", lr_warmup_steps=0, pattern="hierarchical", ranks_per_node=L)
    x, y = batch(0, RANK)
    F.cross_entropy(ddp(x), y).backward()
    before = {k: v.clone() for k, v in state.compression.state.memory.residuals.items()}
    ddp.zero_grad()
    x, y = batch(1, RANK)
    if RANK == SIZE - 1:
        x[0, 0] = float("nan")
    F.cross_entropy(ddp(x), y).backward()
    assert all(torch.isnan(p.grad).all() for p in ddp.module.parameters())
    assert state.stats()["nonfinite_steps"] == 1
    after = state.compression.state.memory.residuals
    assert set(after) == set(before) and all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.skipif(SIZE != 3, reason="the unequal layout [2, 1] is -np 3 with ranks_per_node=2")
def test_unequal_layout_is_refused_at_register():
    ddp = nn.parallel.DistributedDataParallel(model())
    with pytest.raises(ValueError, match=r"nodes of \[2, 1\] ranks"):
        hgc.ddp.register(ddp, "onebit", pattern="hierarchical", ranks_per_node=2)
