"""Paired timing of the DDP hook per bucket against one exchange per step (same ranks, same run).

On a machine whose load drifts (shared cores), two configs measured one after the other differ
by more than the effect sought. Here one DDP model and one hook state alternate between the two
schedules step by step (``state.per_bucket`` switched between steps: ABBA order, so that a drift
weighs on both alike); each step starts after a barrier and counts as the slowest rank's time.

Run it under mpirun (ranks form a gloo group through a file store; on the slow-network harness
``ci/slownet.sh --np K loopback 1gbit -- .venv/bin/python -m horovod_gradcomp.bench.ddp_ab``):
ResNet-50 forward and backward on ``--batch`` random ``--image``-pixel images per rank, DDP's
default buckets, ``SGD(lr=1e-9)``. Prints (and writes with ``--json``) the median step of each
schedule, their ratio, and the ratio of each ABBA pair.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovod_gradcomp.bench.ddp_ab", description=__doc__.split("\n")[0])
    parser.add_argument("--codec", default="onebit",
                        help="a codec with options, as a bench exchange config (onebit:residual_cap=0.0)")
    parser.add_argument("--pairs", type=int, default=4, help="ABBA pairs timed (each: 2 steps of each schedule)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each schedule first (2)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--net", default="loopback 1gbit", help="a label for the output")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from mpi4py import MPI

    import horovod_gradcomp as hgc
    from .resnet import resnet50

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    store = world.bcast(tempfile.mktemp(prefix="hgc-ddp-ab-") if rank == 0 else None, root=0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    torch.manual_seed(0)
    import inspect          # no buffer sync in forward (the flag was renamed in torch 2.13)
    DDP = torch.nn.parallel.DistributedDataParallel
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
    ddp = DDP(resnet50(), bucket_cap_mb=25, **{no_sync: False})
    from .exchange_bench import parse_config
    config = parse_config(args.codec)
    state = hgc.ddp.register(ddp, config.name, **config.options)
    if not state.per_bucket:
        raise SystemExit(f"{args.codec}: this codec exchanges once per step (nothing to compare)")
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-9)
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch, 3, args.image, args.image, generator=gen)
    y = torch.randint(0, 1000, (args.batch,), generator=gen)

    def step(per_bucket: bool) -> float:
        state.per_bucket = per_bucket
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        hgc.ddp.keep_until_exit(t)   # 16 bytes a step; PyTorch 2.13 can abort gloo jobs at exit without it
        return float(t)

    for _ in range(args.warmup):
        step(True)
        step(False)
    times = {True: [], False: []}
    pairs = []
    for _ in range(args.pairs):
        a1, b1, b2, a2 = step(True), step(False), step(False), step(True)
        times[True] += [a1, a2]
        times[False] += [b1, b2]
        pairs.append((b1 + b2) / (a1 + a2))
    out = {"codec": args.codec, "k": size, "net": args.net, "batch": args.batch, "image": args.image,
           "per_bucket_ms": [round(1e3 * t, 1) for t in times[True]],
           "one_exchange_ms": [round(1e3 * t, 1) for t in times[False]],
           "median_per_bucket_ms": round(1e3 * statistics.median(times[True]), 1),
           "median_one_exchange_ms": round(1e3 * statistics.median(times[False]), 1),
           "pair_ratios": [round(r, 3) for r in pairs],
           "load_average": os.getloadavg()}
    out["ratio_of_medians"] = round(out["median_one_exchange_ms"] / out["median_per_bucket_ms"], 3)
    if rank == 0:
        print(json.dumps(out), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    dist.destroy_process_group()
    if rank == 0 and os.path.exists(store):
        os.unlink(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
