"""Run by ci/gpu_check.sh's ddp_nccl step under torchrun, one process per GPU (NCCL refuses two
ranks on one GPU): DDP on NCCL with the package's per-bucket hook, device tensors end to end.

For each codec, a small MLP trains 5 steps with ``hgc.ddp.register`` on DDP's NCCL group; checks:
every rank ends with the same parameters (bitwise: all ranks apply the same decoded means), the
loss is finite, and ``stats()`` counted bytes. Rank 0 prints one line per codec; exit status 1
when a check failed on any rank.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import horovod_gradcomp as hgc

CASES = [("onebit", {}), ("terngrad", {}), ("qsgd", {"bits": 4}), ("dgc", {"density": 0.05})]


def one_case(codec: str, options: dict, device: torch.device) -> bool:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index], bucket_cap_mb=0.05)
    state = hgc.ddp.register(ddp, codec, **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    loss = torch.tensor(float("nan"))
    for _ in range(5):
        x = torch.randn(32, 64, generator=gen).to(device)
        y = torch.randint(0, 10, (32,), generator=gen).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    sent = state.stats().get("bytes_sent", 0)
    ok = same and bool(torch.isfinite(loss)) and sent > 0
    if dist.get_rank() == 0:
        print(f"{codec:9s} {'OK' if ok else 'FAILED'}: same parameters on every rank={same}, "
              f"loss={loss.item():.4f}, bytes_sent={sent}", flush=True)
    return ok


def main() -> int:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local)
    ok = all([one_case(c, o, device) for c, o in CASES])
    flag = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(flag)
    dist.destroy_process_group()
    return 1 if flag.item() else 0


if __name__ == "__main__":
    sys.exit(main())
