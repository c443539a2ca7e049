"""One harness run of ``bench fsdp``: every rank steps every row's FSDP2 model in turn, round by round.

Started by ``bench fsdp`` under mpirun on the slow-network harness
(``python -m horovod_gradcomp.bench.fsdp_step_worker ...``). The ranks form a gloo group (TCP on
the harness's interface, :func:`~horovod_gradcomp.bench.ddp_rows.ensure_group`; MPI only hands
out the port). Each row is examples/train_fsdp.py's character transformer built by its own
``build()`` (every block its own ``fully_shard`` unit, then the root; with ``--hsdp NODES`` each
row shards over the node's ranks, dense FSDP2 over FSDP2's own 2-D mesh) and its optimizer:
``none`` is FSDP2's own reduce-scatter, a codec name ``hgc.fsdp.register(model, codec,
optimizer=opt)`` at its defaults (DGC in HSDP mode with its momentum given:
:func:`hsdp_dgc_options`). All rows live at once and are stepped one after another within
each round (rows A, B, C, A, B, C, ...), so that a drift in the machine's load weighs on every row
alike. A step (forward, backward with its reduce-scatters, optimizer step) starts after a barrier
and counts as the slowest rank's time. The first ``--warmup`` rounds are not timed. Rank 0
writes the rows to ``--json``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import List, Optional

from .ddp_rows import add_worker_arguments

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class _MPIRanks:
    """The part of Horovod's API :func:`~horovod_gradcomp.bench.ddp_rows.ensure_group` uses, on mpi4py."""

    def __init__(self):
        from mpi4py import MPI
        self.comm = MPI.COMM_WORLD

    def rank(self) -> int:
        return self.comm.Get_rank()

    def size(self) -> int:
        return self.comm.Get_size()

    def broadcast_object(self, obj, root_rank: int = 0, name: Optional[str] = None):
        return self.comm.bcast(obj, root=root_rank)


def hsdp_dgc_options(row: str, args: argparse.Namespace) -> dict:
    """The options a row passes to ``hgc.fsdp.register``: none, except DGC in HSDP mode, whose
    momentum is given as the recorded runs (docs/results/fsdp_step_time.md) gave it, from before HSDP
    mode took it over from the optimizer itself: SGD's 0.9 (the optimizer then steps with momentum
    0; ``register(..., optimizer=opt)`` without it now trains bitwise the same) or 0.0 under AdamW
    (DGC runs without momentum correction under Adam on every path)."""
    if row != "dgc" or not args.hsdp:
        return {}
    return {"momentum": 0.9 if args.optimizer == "sgd" else 0.0}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m horovod_gradcomp.bench.fsdp_step_worker",
                                description=__doc__.split("\n")[0])
    p.add_argument("--rows", required=True, help="comma-separated: none and codec names")
    p.add_argument("--hsdp", type=int, default=0, metavar="NODES", help="HSDP over NODES nodes (0: sharded)")
    p.add_argument("--steps", type=int, required=True, help="timed rounds")
    p.add_argument("--warmup", type=int, required=True, help="untimed rounds first")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), required=True)
    p.add_argument("--model", default="", help="extra options of examples/train_fsdp.py, e.g. '--width 128'")
    add_worker_arguments(p, "gloo's interface")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import horovod_gradcomp as hgc
    from .ddp_rows import close_worker, ensure_group

    sys.path.insert(0, str(EXAMPLES))
    import train_fsdp
    from common import load_text

    ranks = _MPIRanks()
    ensure_group(ranks, args.net)
    torch.set_num_threads(1)
    rank = dist.get_rank()
    rows = args.rows.split(",")
    built = []
    for row in rows:
        opts = train_fsdp.parse_args(["--codec", row, "--optimizer", args.optimizer, "--hsdp", str(args.hsdp),
                                      *args.model.split()])
        if row == rows[0]:
            x_tr, y_tr, _, _, vocab = load_text(opts.context)
        model = train_fsdp.build(opts, vocab)
        options = hsdp_dgc_options(row, args)
        if options.get("momentum"):     # DGC applies SGD's momentum itself: the optimizer steps without it
            opt = torch.optim.SGD(model.parameters(), lr=opts.lr or 0.1, momentum=0.0)
        else:
            opt = train_fsdp.make_optimizer(opts, model.parameters())
        if row == "none":
            state = None
            hgc.ddp.hold_backward_context(model)   # gloo's abort at exit (horovod_gradcomp/ddp/gloo_exit.py)
        else:
            state = hgc.fsdp.register(model, row, optimizer=opt, **options)
        gen = torch.Generator().manual_seed(rank)
        built.append((row, model, opt, state, gen, opts.batch_size, options))

    def step(model, opt, gen, batch) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        idx = torch.randint(0, len(x_tr), (batch,), generator=gen)
        F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
        opt.step()
        opt.zero_grad()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        hgc.ddp.keep_until_exit(t)   # PyTorch 2.13 can abort gloo jobs at exit without it
        return float(t)

    times = {row: [] for row in rows}
    stats0 = {}
    for r in range(args.warmup + args.steps):
        if r == args.warmup:
            stats0 = {row: state.stats() for row, _, _, state, _, _, _ in built if state is not None}
        for row, model, opt, state, gen, batch, _ in built:
            t = step(model, opt, gen, batch)
            if r >= args.warmup:
                times[row].append(t)
    out = []
    for row, model, opt, state, gen, batch, options in built:
        ms = [round(1e3 * t, 2) for t in times[row]]
        entry = {"row": row, "rate": args.rate, "net": args.net, "k": dist.get_world_size(), "hsdp": args.hsdp,
                 "optimizer": args.optimizer, "steps": args.steps, "warmup": args.warmup, "step_ms": ms,
                 "median_ms": round(statistics.median(ms), 2), "parameters": sum(p.numel() for p in model.parameters()),
                 "model": args.model, "options": {k: str(v) for k, v in options.items()},
                 "load_average": os.getloadavg()[0]}
        if state is not None:
            before, after = stats0[row], state.stats()
            sent = (after["bytes_sent"] - before["bytes_sent"]) / args.steps
            entry.update(mode=state.mode, bytes_sent_per_step=sent, memory_bytes=after["memory_bytes"])
            for key in ("encode_s", "exchange_s", "decode_s"):     # sharded mode: this rank's codec seconds
                if key in after:
                    entry[key.replace("_s", "_ms_per_step")] = round(1e3 * (after[key] - before[key]) / args.steps, 2)
            if args.hsdp:
                entry["bytes_sent_replica_per_step"] = (after["bytes_sent_replica"] - before["bytes_sent_replica"]) \
                    / args.steps
        out.append(entry)
        if rank == 0:
            print(f"[fsdp] {args.rate} {'hsdp' if args.hsdp else 'sharded'} {row}: median {entry['median_ms']:.1f} ms",
                  file=sys.stderr, flush=True)
    del built
    return close_worker(rank, args.json, out)


if __name__ == "__main__":
    sys.exit(main())
