"""One harness run of ``bench tta``: every rank trains every (optimizer, row) in turn.

Started by ``bench tta`` under mpirun on the slow-network harness
(``python -m horovod_gradcomp.bench.tta_worker ...``). For each optimizer and row, every rank
builds the same model from the same seed, reads its own shard of the text in the same seeded
order, and trains ``--steps`` steps; the rows of one optimizer take turns, one step each
(:func:`~horovod_gradcomp.bench.tta_rows.interleaved_points`), so that the machine's load
drifting during the run weighs on every row alike; no two steps ever run at once. Rank 0
writes the rows to ``--json``: per row its name, optimizer, the held-out loss points against
steps and training seconds, the final loss, the parameter count and what was built. Before any timed row, every row runs
``--warmup-steps`` untimed steps on a throwaway model (the process's one-time costs).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from .ddp_rows import add_worker_arguments


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m horovod_gradcomp.bench.tta_worker", description=__doc__.split("\n")[0])
    p.add_argument("--rows", required=True, help="comma-separated rows (bench/tta_rows.py)")
    p.add_argument("--optimizers", required=True, help="comma-separated: sgd, adamw")
    p.add_argument("--size", required=True, help="the model's size (bench/tta_model.py SIZES)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--eval-every", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=2,
                   help="untimed steps of every row on a throwaway model first, so that the process's one-time "
                        "costs (Horovod's first collectives, the gloo group, lazy imports) fall on no row")
    p.add_argument("--sgd-lr", type=float, required=True)
    p.add_argument("--momentum", type=float, required=True)
    p.add_argument("--adamw-lr", type=float, required=True)
    p.add_argument("--weight-decay", type=float, required=True)
    p.add_argument("--powersgd-start", type=int, required=True)
    add_worker_arguments(p, "DDP's gloo group")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import torch
    import horovod.torch as hvd
    from .ddp_rows import close_worker
    from .tta_data import batches, load
    from .tta_model import SIZES, CharTransformer, parameter_count
    from .tta_rows import Hyper, Trainer, interleaved_points

    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    shape = SIZES[args.size]
    data = load(shape.context, rank, size)
    hyper = Hyper(args.sgd_lr, args.momentum, args.adamw_lr, args.weight_decay, args.powersgd_start)

    def barrier():
        hvd.allreduce(torch.zeros(1), name="tta.barrier")

    def build(row, optimizer):
        torch.manual_seed(args.seed)
        model = CharTransformer(data.vocab, shape)
        return model, Trainer(row, optimizer, model, hvd, args.net, hyper)

    for optimizer in args.optimizers.split(","):
        for row in args.rows.split(",") if args.warmup_steps > 0 else ():
            _, trainer = build(row, optimizer)
            stream = batches(data, args.batch, args.seed * 1000 + rank)
            for _ in range(args.warmup_steps):
                trainer.step(next(stream))
            del trainer
            barrier()
    out = []
    for optimizer in args.optimizers.split(","):
        rows = args.rows.split(",")
        built = [build(row, optimizer) for row in rows]
        streams = [batches(data, args.batch, args.seed * 1000 + rank) for _ in rows]
        all_points = interleaved_points([trainer for _, trainer in built], streams, data.held_out, args.steps,
                                        args.eval_every, barrier)
        for row, (model, trainer), points in zip(rows, built, all_points):
            if rank == 0:
                print(f"[tta] {args.rate} {optimizer} {row}: loss {points[0]['loss']:.3f} -> {points[-1]['loss']:.3f} "
                      f"in {points[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
            out.append({"row": row, "optimizer": optimizer, "rate": args.rate, "net": args.net, "k": size,
                        "size": args.size, "params": parameter_count(model), "batch_per_rank": args.batch,
                        "steps": args.steps, "points": points, "final_loss": points[-1]["loss"],
                        "seconds": points[-1]["seconds"], "factory": trainer.factory,
                        "lr": hyper.sgd_lr if optimizer == "sgd" else hyper.adamw_lr,
                        "load_average": os.getloadavg()[0]})
        del built
        barrier()
    return close_worker(rank, args.json, out)


if __name__ == "__main__":
    sys.exit(main())
