"""The digits task of examples/train.py through hgc.DoubleBufferedStep, with or without double buffering.

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python examples/train_pipeline.py \\
        --codec onebit --pipeline --json

Same data, shards, model, SGD hyperparameters and seeds as examples/train.py, but the
step is hgc.DoubleBufferedStep over a plain torch.optim.SGD (no hvd.DistributedOptimizer):
``--pipeline`` splits each minibatch into halves, exchanges one half's gradient while the
next half is computed and applies each half's update one half late (two updates of half
weight per minibatch); without it each minibatch is one synchronous step. The outstanding
update is flushed at the end of every epoch. ``--codec``: none, fp16 or a codec name. With
``--json`` rank 0 prints one JSON object last; the exit status is 3 if parameters differ
across ranks.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_codec_args, codec_options, digits_setup, params_digest  # noqa: E402
from train import make_compression  # noqa: E402

import horovod_gradcomp as hgc  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_codec_args(p, "none | fp16 | a codec name")
    p.add_argument("--pipeline", action="store_true", help="double buffering (off: the synchronous step)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank; even with --pipeline")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
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
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = make_compression(args.codec, model, codec_options(args.codec_opt), args.momentum)
    own_momentum = isinstance(getattr(compression, "memory", None), hgc.DGCMemory)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.0 if own_momentum else args.momentum)
    step = hgc.DoubleBufferedStep(model.named_parameters(), optimizer, compression, double_buffering=args.pipeline)

    def loss_fn(x, y):
        return F.cross_entropy(model(x), y)

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    t0 = time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        if hasattr(compression, "set_epoch"):
            compression.set_epoch(epoch)
        order = torch.randperm(len(x_shard), generator=gen)
        loss_sum = 0.0
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            loss_sum += step.step(loss_fn, (x_shard[idx], y_shard[idx]))
        step.flush()
        train_loss = hvd.allreduce(torch.tensor(loss_sum / steps), name=f"loss.{epoch}").item()
    step.close()
    seconds = time.perf_counter() - t0

    identical = len(set(hvd.allgather_object(params_digest(model)))) == 1
    if rank == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        label = f"{args.codec}{' pipelined' if args.pipeline else ''}"
        print(f"[{label}] {size} ranks, {args.epochs} epochs x {steps} minibatches ({step.updates} updates): "
              f"test accuracy {acc:.4f}, train loss {train_loss:.4f}, {seconds:.1f} s, "
              f"params identical across ranks: {identical}", flush=True)
        if args.json:
            print(json.dumps({"codec": args.codec, "pipeline": args.pipeline, "ranks": size, "epochs": args.epochs,
                              "test_accuracy": acc, "train_loss": train_loss, "updates": step.updates,
                              "seconds": seconds, "params_identical": identical, "batch_size": args.batch_size,
                              "lr": args.lr, "momentum": args.momentum, "seed": args.seed}), flush=True)
    hvd.shutdown()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
