"""A process-set model built on every rank, as Horovod allows (launched by
tests/test_horovod_contract_launch.py under mpirun at -np 3 and 4).

Every rank builds the same model, ``hgc.Compression.<codec>(..., process_set=ps)`` and
``hvd.DistributedOptimizer(..., process_set=ps)`` for ps = ranks {0, 2}. On the set's ranks the
exchange runs over the set; on the others both objects are inert, so those ranks train alone,
exactly like a plain local optimizer. Checked for every codec and for ``none`` / ``fp16``.
Exit status 0 on success; an assertion fails the run otherwise.
"""
from __future__ import annotations

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import horovod_gradcomp as hgc

MEMBERS = [0, 2]
STEPS = 3
FACTORIES = {
    "onebit": {}, "terngrad": {}, "qsgd": {"bits": 4},
    "dgc": {"density": 0.3, "momentum": 0.9, "check_optimizer": False},
    "none": {}, "fp16": {},
}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def batches(step: int, rank: int):
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(10, 6, generator=gen), torch.randint(0, 3, (10,), generator=gen)


def train(opt, model, rank: int) -> None:
    for step in range(STEPS):
        x, y = batches(step, rank)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def check(name: str, ps, rank: int) -> None:
    model = make_model()
    comp = getattr(hgc.Compression, name)(model.named_parameters(), process_set=ps, **FACTORIES[name])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp, process_set=ps)
    train(opt, model, rank)
    alone = make_model()
    train(torch.optim.SGD(alone.parameters(), lr=0.1), alone, rank)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0)
    every = hvd.allgather(flat, name=f"test.{name}.final")
    steps = comp.stats()["steps"]
    if rank in MEMBERS:
        assert torch.equal(every[MEMBERS[0]], every[MEMBERS[1]]), f"{name}: the set's ranks differ"
        assert steps == STEPS, f"{name}: rank {rank} in the set counted {steps} steps"
    else:
        same = all(torch.equal(a, b) for a, b in zip(alone.parameters(), model.parameters()))
        assert same, f"{name}: rank {rank}, outside the set, did not train like a local optimizer"
        assert steps == 0, f"{name}: rank {rank}, outside the set, counted {steps} exchanges"


def main() -> int:
    ps = hvd.ProcessSet(MEMBERS)
    hvd.init(process_sets=[ps])
    assert hvd.size() >= 3, f"run with 3 or more processes, got {hvd.size()}"
    for name in FACTORIES:
        check(name, ps, hvd.rank())
    if hvd.rank() == 0:
        print(f"process set {MEMBERS} built on all {hvd.size()} ranks: OK for {list(FACTORIES)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
