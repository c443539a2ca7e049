"""The DDP comm hook against the mpi4py path under mpirun (-np 1, 2, 3, 4).

torch.distributed (gloo) is initialized on the mpirun ranks; a DDP model with
``hgc.ddp.register`` trains a few steps, and every step its averaged gradients must be
bitwise what ``CodecCompression.exchange`` over mpi4py makes of the same local gradients
(computed on a plain copy of the model), for every codec and both patterns; the hook's
state_dict must equal the mpi4py compression's.
"""
from __future__ import annotations

import copy
import os
import socket

import horovod.torch as hvd
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import horovod_gradcomp as hgc

from .mpi_helpers import init
from .mpi_transports import flat_state

RANK, SIZE = init()
STEPS = 3

CASES = {  # id: (codec, options)
    "onebit": ("onebit", {}),
    "onebit-two_phase": ("onebit", {"pattern": "two_phase"}),
    "terngrad": ("terngrad", {"seed": 1}),
    "qsgd-two_phase": ("qsgd", {"bits": 4, "bucket": 32, "seed": 2, "pattern": "two_phase"}),
    "qsgd-elias": ("qsgd", {"bits": 4, "coding": "elias", "seed": 3}),
    "dgc": ("dgc", {"density": 0.1, "seed": 4, "momentum": 0.9}),
}


def setup_module(module):
    if not dist.is_initialized():
        port = None
        if RANK == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = hvd.broadcast_object(port, root_rank=0, name="hgc.test.ddp.port")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=RANK, world_size=SIZE)


def model():
    torch.manual_seed(0)
    # small buckets: the model spans several DDP buckets
    return nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 30), nn.ReLU(), nn.Linear(30, 5))


def batch(step, rank):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen)


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_hook_matches_mpi_path_bitwise(case):
    codec, options = CASES[case]
    plain = model()
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=0.004)
    state = hgc.ddp.register(ddp, codec, **options)
    factory = getattr(hgc.Compression, codec)
    extra = {"check_optimizer": False} if codec == "dgc" else {}
    by_mpi = factory(list(plain.named_parameters()), transport="mpi", **options, **extra)
    for step in range(STEPS):
        x, y = batch(step, RANK)
        ddp.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        plain.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        want = by_mpi.exchange({n: p.grad.clone() for n, p in plain.named_parameters()})
        for n, p in ddp.module.named_parameters():
            assert torch.equal(p.grad, want[n]), f"{case} step {step}: {n} differs from the mpi4py path"
        with torch.no_grad():  # the same update on both copies keeps their inputs equal
            for (n, p), q in zip(plain.named_parameters(), ddp.module.parameters()):
                p -= 0.1 * want[n]
                q -= 0.1 * q.grad
    a, b = flat_state(state.state_dict()), flat_state(by_mpi.state_dict())
    assert [k for k, _ in a] == [k for k, _ in b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))
    stats = state.stats()
    assert stats["steps"] == STEPS and stats["bytes_payload"] == by_mpi.stats()["bytes_payload"]


def test_register_rejects_bad_input():
    ddp = nn.parallel.DistributedDataParallel(model())
    with pytest.raises(ValueError, match="unknown codec"):
        hgc.ddp.register(ddp, "nope")
    with pytest.raises(ValueError, match="does not apply"):
        hgc.ddp.register(ddp, "onebit", bucket_bytes=1 << 20)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        hgc.ddp.register(model(), "onebit")
