"""Averaging and asynchronous schemes on scikit-learn's bundled digits, next to synchronous SGD.

Run (4 ranks, asynchronous ADAG with a window of 8 local steps):

    mpirun --allow-run-as-root --oversubscribe -np 4 .venv/bin/python examples/schemes.py --scheme adag --window 8

``--scheme`` is one of ``sync-sgd`` (Horovod's allreduce of the gradients every step: the
baseline), ``model-averaging`` (``--period``), ``easgd`` / ``easgd-async`` (``--period``,
``--alpha``), ``downpour`` (``--push-every``, ``--fetch-every``) or ``adag`` (``--window``).
``--codec onebit`` (or any registered codec) sends the schemes' pushes and differences
encoded, with error feedback. Every rank trains on its shard (``rank::size``) of a fixed
stratified 80/20 split for ``--epochs`` epochs, so every scheme sees the same number of
samples. At the end (``trainer.finish()``) every rank holds the same model; rank 0
evaluates it on the test set. ``--json``: rank 0 prints a JSON summary as its last line;
the exit status is 3 if the ranks' final parameters differ.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from mpi4py import MPI
from tqdm import tqdm

import horovod_gradcomp as hgc
from common import load_data, load_text, params_digest, shard

SCHEMES = ("sync-sgd", "model-averaging", "easgd", "easgd-async", "downpour", "adag")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scheme", choices=SCHEMES, default="adag")
    p.add_argument("--task", choices=("digits", "charlm"), default="digits",
                   help="digits: sklearn's images; charlm: next-character prediction on a text Python ships")
    p.add_argument("--context", type=int, default=16, help="charlm: characters of context")
    p.add_argument("--period", type=int, default=8, help="model-averaging / easgd: local steps between exchanges")
    p.add_argument("--alpha", type=float, default=0.1, help="easgd: elastic coefficient")
    p.add_argument("--push-every", type=int, default=4, help="downpour")
    p.add_argument("--fetch-every", type=int, default=4, help="downpour")
    p.add_argument("--window", type=int, default=8, help="adag: communication window")
    p.add_argument("--codec", default="none", help="none or a codec: for the schemes, of their messages; for sync-sgd, of the gradients (hgc.Compression): "
                   + ", ".join(hgc.available_codecs()))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow-ms", type=float, default=0.0, help="the last rank sleeps this long after every step")
    p.add_argument("--label", default=None, help="name of this run in the output (default: --scheme)")
    p.add_argument("--json", action="store_true", help="rank 0 prints a JSON summary as its last line")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway when not a tty)")
    return p.parse_args(argv)


def make_model(args, x_tr, classes):
    if args.task == "charlm":
        return nn.Sequential(nn.Embedding(classes, 16), nn.Flatten(), nn.Linear(16 * args.context, args.hidden),
                             nn.ReLU(), nn.Linear(args.hidden, classes))
    return nn.Sequential(nn.Linear(x_tr.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))


def make_trainer(args, model, optimizer):
    """The scheme object (None for sync-sgd, whose optimizer is Horovod's)."""
    codec = None if args.codec == "none" else args.codec
    if args.scheme == "model-averaging":
        return hgc.ModelAveraging(model, optimizer, period=args.period, codec=codec)
    if args.scheme in ("easgd", "easgd-async"):
        return hgc.EASGD(model, optimizer, period=args.period, alpha=args.alpha,
                         asynchronous=args.scheme == "easgd-async", codec=codec)
    if args.scheme == "downpour":
        return hgc.Downpour(model, optimizer, push_every=args.push_every, fetch_every=args.fetch_every, codec=codec)
    if args.scheme == "adag":
        return hgc.ADAG(model, optimizer, window=args.window, codec=codec)
    return None


def main(argv=None):
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    label = args.label or args.scheme
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if args.task == "charlm":
        x_tr, y_tr, x_te, y_te, classes = load_text(args.context)
    else:
        x_tr, y_tr, x_te, y_te = load_data(args.seed)
        classes = 10
    x_shard, y_shard, steps = shard(x_tr, y_tr, rank, size, args.batch_size)

    model = make_model(args, x_tr, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    hvd = None
    if args.scheme == "sync-sgd":
        import horovod.torch as hvd
        hvd.init()
        compression = hvd.Compression.none
        if args.codec != "none":  # synchronous SGD through a gradient codec (the other family, for comparison)
            compression = getattr(hgc.Compression, args.codec)(model.named_parameters())
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    trainer = make_trainer(args, model, optimizer)

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    bar = tqdm(total=args.epochs * steps, desc=label, file=sys.stderr, leave=False,
               disable=rank != 0 or args.no_progress or not sys.stderr.isatty())
    t0 = time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_shard), generator=gen)
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_shard[idx]), y_shard[idx])
            loss.backward()
            if trainer is None:
                optimizer.step()
            else:
                trainer.step()
            if args.slow_ms and rank == size - 1:
                time.sleep(args.slow_ms / 1000)
            bar.update()
        bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.4f}")
    train_seconds = time.perf_counter() - t0
    if trainer is not None:
        trainer.finish()
    seconds = time.perf_counter() - t0
    bar.close()

    digests = comm.allgather(params_digest(model))
    identical = len(set(digests)) == 1
    stats = trainer.stats() if trainer is not None else {}
    every = comm.gather(stats, root=0)
    every_codec = comm.gather(compression.stats() if hvd is not None and args.codec != "none" else {}, root=0)
    if rank == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
            test_loss = F.cross_entropy(model(x_te), y_te).item()
        sent = sum(s.get("bytes_sent", 0) for s in every)
        samples = args.epochs * steps * args.batch_size * size
        if trainer is None and args.codec != "none":  # the codec's own count of what each rank sent
            sent = sum(comm_stats.get("bytes_sent", 0) for comm_stats in every_codec)
        elif trainer is None:  # Horovod's ring allreduce of every gradient: 2 (K-1)/K of the model per rank
            numel = sum(p.numel() for p in model.parameters())
            sent = args.epochs * steps * size * 2 * (size - 1) * numel * 4 // size
        print(f"[{label}] {size} ranks, {args.epochs} epochs x {steps} steps: test accuracy {acc:.4f}, "
              f"test loss {test_loss:.4f}, {sent / samples:,.0f} B sent per sample, {seconds:.1f} s, "
              f"params identical across ranks: {identical}", flush=True)
        if trainer is not None:
            s0 = every[0]
            print(f"[{label}] rank 0: pushes {s0.get('pushes', 0)}, pulls {s0.get('pulls', 0)}, exchanges "
                  f"{s0.get('exchanges', 0)}, staleness histogram {s0.get('staleness_histogram', {})}", flush=True)
        if args.json:
            print(json.dumps({
                "scheme": label, "task": args.task, "ranks": size, "epochs": args.epochs, "steps_per_epoch": steps,
                "test_accuracy": acc, "test_loss": test_loss, "bytes_sent_per_sample": sent / samples,
                "train_seconds": train_seconds, "seconds": seconds, "params_identical": identical,
                "codec": args.codec, "lr": args.lr, "momentum": args.momentum, "batch_size": args.batch_size,
                "period": args.period, "alpha": args.alpha, "window": args.window, "push_every": args.push_every,
                "fetch_every": args.fetch_every, "stats": every,
            }), flush=True)
    if hvd is not None:
        hvd.shutdown()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
