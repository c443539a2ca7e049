"""1-bit SGD with AdaGrad (the paper's pairing) on the digits task, through stock hvd.DistributedOptimizer.

    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \\
        .venv/bin/python examples/onebit_adagrad.py --json

The data, shards, model and seeds of examples/train.py; the optimizer is
``torch.optim.Adagrad`` wrapped in ``hvd.DistributedOptimizer(...,
compression=hgc.Compression.onebit(...))``: each rank's gradient is quantized to one bit
per value with error feedback, the decoded mean over ranks is what AdaGrad sees. (The
paper applies AdaGrad at the stripe owner, between its two quantizations; here AdaGrad
runs on every rank after the exchange, on the identical averaged gradient.)
``--codec none`` runs the same with Horovod's dense allreduce, for comparison. Rank 0
prints the test accuracy (and one JSON object last with ``--json``); the exit status is 3
if parameters differ across ranks.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import horovod.torch as hvd
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import digits_setup, params_digest, train_epoch  # noqa: E402

import horovod_gradcomp as hgc  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--codec", choices=("onebit", "none"), default="onebit")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="AdaGrad's learning rate")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    model, x_shard, y_shard, steps, x_te, y_te = digits_setup(args.seed, args.hidden, rank, size, args.batch_size)
    compression = (hgc.Compression.onebit(model.named_parameters()) if args.codec == "onebit"
                   else hgc.Compression.none())
    optimizer = hvd.DistributedOptimizer(torch.optim.Adagrad(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    t0 = time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        loss_sum = train_epoch(model, optimizer, x_shard, y_shard, steps, args.batch_size, gen)
        train_loss = hvd.allreduce(torch.tensor(loss_sum / steps), name=f"loss.{epoch}").item()
    seconds = time.perf_counter() - t0

    identical = len(set(hvd.allgather_object(params_digest(model)))) == 1
    stats = compression.stats()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        print(f"[{args.codec} + Adagrad] {size} ranks, {args.epochs} epochs x {steps} steps, lr {args.lr}: test "
              f"accuracy {acc:.4f}, train loss {train_loss:.4f}, {stats['bytes_sent_per_step']:,.0f} B/step sent, "
              f"{seconds:.1f} s, params identical across ranks: {identical}", flush=True)
        if args.json:
            print(json.dumps({"codec": args.codec, "optimizer": "Adagrad", "ranks": size, "epochs": args.epochs,
                              "test_accuracy": acc, "train_loss": train_loss, "lr": args.lr,
                              "bytes_sent_per_step": stats["bytes_sent_per_step"], "seconds": seconds,
                              "params_identical": identical}), flush=True)
    hvd.shutdown()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
