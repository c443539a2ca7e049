"""Process sets, launched by tests/test_transport_launch.py with 3 processes under mpirun
and under ``horovodrun --gloo``: the exchange runs on the set's ranks only.

Set {0, 2}: its ranks train a model through ``hvd.DistributedOptimizer(process_set=ps)``
with ``hgc.Compression.onebit(..., process_set=ps)``; every step each set rank's averaged
gradient must equal the mean over the set of the pure-torch reference codec's decoded
``g_k + r_k`` (gradients gathered through the global set, independently of the exchange).
Rank 1, outside the set, never touches the set and trains alone: at the end the set's ranks
hold equal parameters and rank 1 its own.
Exit status 0 on success; an assertion fails the run otherwise.
"""
from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import horovod_gradcomp as hgc
from horovod_gradcomp.transports.horovod_ops import HorovodCommunicator

MEMBERS = [0, 2]
STEPS = 4


def main():
    ps = hvd.ProcessSet(MEMBERS)
    hvd.init(process_sets=[ps])
    assert hvd.size() == 3, f"run with 3 processes, got {hvd.size()}"
    rank = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    before = [p.detach().clone() for p in model.parameters()]
    ref = hgc.get_codec("onebit", impl="reference")
    residual = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    inside = ps.included()
    if inside:
        # checked step by step against plain error feedback (no residual cap, which SGD takes by default)
        comp = hgc.Compression.onebit(model.named_parameters(), process_set=ps, residual_cap=0.0)
        assert isinstance(comp.communicator, HorovodCommunicator), comp.communicator
        assert (comp.communicator.size, comp.communicator.rank) == (2, MEMBERS.index(rank))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=comp, process_set=ps)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(10, 6, generator=gen), torch.randint(0, 3, (10,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        local = {n: p.grad.clone() for n, p in model.named_parameters()}
        if inside:
            opt.synchronize()
        # every rank (the outsider too) joins this global gather of the local gradients
        for n, p in model.named_parameters():
            every = hvd.allgather((local[n] + residual[n]).unsqueeze(0), name=f"test.g.{step}.{n}")
            if not inside:
                continue
            decoded = [ref.decode(ref.encode(every[k].clone())) for k in MEMBERS]
            want = torch.stack(decoded).double().mean(0).float()
            mine = every[rank]
            residual[n] = mine - ref.decode(ref.encode(mine.clone()))
            torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-6, msg=f"rank {rank} step {step} {n}")
        if inside:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0)
    every = hvd.allgather(flat, name="test.final")
    assert torch.equal(every[0], every[2]), "the set's ranks ended with different parameters"
    assert not torch.equal(every[1], every[0]), "rank 1 (outside the set) followed the set's updates"
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters())), "nothing trained"
    if rank == 0:
        print(f"process sets OK on {'gloo' if hvd.gloo_enabled() else 'mpi'}: set {MEMBERS} of 3 ranks, "
              f"{STEPS} steps", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
